//! The web console and the typed TypeScript client: the OpenAPI document the client is generated from is the one
//! the service serves; every console file is embedded and served with its type, a strict policy and a validator;
//! the console builds its pages without HTML strings and loads nothing from elsewhere; and, in headless Chromium
//! against `dev`, each view renders, a reservation made in the console shows in its pool's calendar, and events
//! made through the API show on the open page without a reload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse as _;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::http_api::Api;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Every file under `dir`, as paths relative to it with `/` between folders.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read the folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(root, &path, found);
            } else {
                let relative = path.strip_prefix(root).expect("under the root");
                found
                    .push(relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, dir, &mut found);
    found.sort();
    found
}

#[tokio::test]
async fn the_typescript_clients_openapi_document_is_the_one_the_service_serves() {
    let served = bc_api::http::openapi::document().await.into_response();
    assert_eq!(served.status(), StatusCode::OK);
    let bytes = served.into_body().collect().await.expect("the document").to_bytes();
    let served: Value = serde_json::from_slice(&bytes).expect("JSON");
    // Written in the order the service writes it, pretty, so that a change of the API reads as a small diff.
    let text = serde_json::to_string_pretty(bc_api::http::openapi::document_once()).expect("the document") + "\n";
    assert_eq!(serde_json::from_str::<Value>(&text).expect("JSON"), served, "the same document as served");
    let path = workspace().join("clients/typescript/openapi.json");
    if std::env::var("UPDATE_EXPECT").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).expect("write clients/typescript/openapi.json");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "clients/typescript/openapi.json is not the document the service serves: run `UPDATE_EXPECT=1 cargo test -p \
         bc-api --test it console`, then `npm run check` in clients/typescript, and commit both"
    );
}

/// A GET through the router without a token, as a browser loads the console's files.
async fn load(api: &Api, uri: &str, headers: &[(&str, &str)]) -> axum::http::Response<Body> {
    let mut request = Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    api.router.clone().oneshot(request.body(Body::empty()).expect("request")).await.expect("response")
}

#[tokio::test]
async fn every_console_file_is_embedded_and_served_with_its_type_a_strict_policy_and_a_validator() {
    let api = Api::new().await;
    let on_disk = files_under(&workspace().join("console"));
    let mut embedded: Vec<String> = bc_api::http::console::ASSETS.iter().map(|(name, _)| (*name).to_owned()).collect();
    embedded.sort();
    assert_eq!(embedded, on_disk, "every file of console/ is in the table of api/src/http/console.rs, and only those");
    for name in &on_disk {
        let answer = load(&api, &format!("/console/{name}"), &[]).await;
        assert_eq!(answer.status(), StatusCode::OK, "{name}");
        let headers = answer.headers().clone();
        let wanted = match name.rsplit_once('.').map(|(_, ext)| ext) {
            Some("html") => "text/html; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            other => panic!("a console file of an unexpected kind: {other:?}"),
        };
        assert_eq!(headers["content-type"], wanted, "{name}");
        let policy = headers["content-security-policy"].to_str().expect("text");
        assert!(policy.starts_with("default-src 'self';"), "{policy}");
        assert!(!policy.contains("unsafe") && !policy.contains('*') && !policy.contains("http"), "{policy}");
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["cache-control"], "no-cache");
        let tag = headers["etag"].to_str().expect("text").to_owned();
        let body = answer.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body.to_vec(), std::fs::read(workspace().join("console").join(name)).expect("the file"), "{name}");
        // The validator answers 304 with no body, and a stale one the file.
        let again = load(&api, &format!("/console/{name}"), &[("if-none-match", &tag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{name}");
        assert!(again.into_body().collect().await.expect("body").to_bytes().is_empty());
        let stale = load(&api, &format!("/console/{name}"), &[("if-none-match", "\"0\"")]).await;
        assert_eq!(stale.status(), StatusCode::OK, "{name}");
    }
    // `/console` sends the browser to `/console/`, which is the page.
    let root = load(&api, "/console", &[]).await;
    assert_eq!(root.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(root.headers()["location"], "/console/");
    let page = load(&api, "/console/", &[]).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    // Nothing else is served from there: not a missing file, not a path out of the folder.
    for uri in ["/console/missing.js", "/console/../Cargo.toml", "/console/%2e%2e/Cargo.toml", "/console/views"] {
        let answer = load(&api, uri, &[]).await;
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "{uri}");
        let body: Value =
            serde_json::from_slice(&answer.into_body().collect().await.expect("body").to_bytes()).expect("JSON");
        assert_eq!(body["error"]["code"], "NOT_FOUND", "{uri}");
    }
}

#[test]
fn the_console_builds_pages_without_html_strings_and_loads_nothing_from_elsewhere() {
    let dir = workspace().join("console");
    for name in files_under(&dir) {
        let text = std::fs::read_to_string(dir.join(&name)).expect("a text file");
        // The SVG namespace is a name, not an address the page loads.
        let addresses = text.replace("http://www.w3.org/2000/svg", "");
        assert!(!addresses.contains("http://") && !addresses.contains("https://"), "{name} names another origin");
        assert!(!addresses.contains("//cdn") && !addresses.contains("@import"), "{name} loads from elsewhere");
        if name.ends_with(".js") {
            assert!(text.starts_with("// @ts-check\n"), "{name} is type-checked (// @ts-check on its first line)");
            for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"] {
                assert!(!text.contains(sink), "{name} uses {sink}: build elements with dom.js's h() instead");
            }
        }
        if name.ends_with(".html") {
            // Every script is a file of the console, so the policy needs no 'unsafe-inline'.
            for script in text.split("<script").skip(1) {
                let tag = script.split('>').next().unwrap_or("");
                assert!(tag.contains("src=\"") && script.contains("></script>"), "{name} has an inline script");
            }
            assert!(!text.contains(" style=\"") && !text.contains(" on"), "{name} has inline styles or handlers");
        }
    }
}

/// The browser driver's next line, which must start with `wanted`; the words after it.
fn expect_line(lines: &std::sync::mpsc::Receiver<String>, wanted: &str) -> Vec<String> {
    let line = lines
        .recv_timeout(Duration::from_secs(180))
        .unwrap_or_else(|_| panic!("the browser driver never said {wanted:?}"));
    let rest = line.strip_prefix(wanted).unwrap_or_else(|| panic!("the browser driver said {line:?}, not {wanted:?}"));
    rest.split_whitespace().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_headless_chromium_shows_every_view_and_what_the_api_changes_without_a_reload() {
    use std::io::Write as _;
    if !crate::hostile::slow_tests_enabled("console in chromium") {
        return;
    }
    // `dev`, as a newcomer runs it: its own database, its simulated machines, its tokens.
    let pg = bc_eventstore::testing::server();
    let data_dir = pg.scratch_dir("console");
    pg.stop_cluster_at_exit(&data_dir);
    let mut dev = crate::process::command(&["dev", "--listen", "127.0.0.1:0", "--insecure-http", "--data-dir"]);
    // dev adds its server to the CLI's configuration: this test's own file, not the user's.
    dev.arg(&data_dir).env("BETTER_COMPUTE_CONFIG", pg.scratch_dir("console-cli").join("config.toml"));
    let mut server = crate::process::Server::start(dev);
    let admin = server.line_containing("platform administrator");
    let admin = admin.split("Bearer ").nth(1).expect("a bearer token").trim().to_owned();
    let customer = server.line_containing("demo customer");
    let customer = customer.split("Bearer ").nth(1).expect("a bearer token").trim().to_owned();
    let console_line = server.line_containing("the console: ");
    assert!(console_line.ends_with(&format!("{}/console (sign in with one of the tokens above)", server.base_url)));
    let client = server.client();
    let base = server.base_url.clone();
    let call = |method: reqwest::Method, path: &str, body: Value| {
        let request = client.request(method, format!("{base}{path}")).bearer_auth(&admin).json(&body);
        async move {
            let answer = request.send().await.expect("a call of the API");
            let status = answer.status();
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            assert!(status.is_success(), "{status}: {body}");
            body
        }
    };
    // dev's five simulated machines, once the read side lists them all.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let nodes = loop {
        let listed = call(reqwest::Method::GET, "/v1/nodes", Value::Null).await;
        let nodes = listed["items"].as_array().expect("nodes").clone();
        if nodes.len() == 5 {
            break nodes;
        }
        assert!(std::time::Instant::now() < deadline, "dev's nodes never listed: {listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let shots = std::env::var("BETTER_COMPUTE_CONSOLE_SCREENSHOTS").unwrap_or_default();
    let shots = if shots.is_empty() {
        String::new()
    } else {
        let dir = workspace().join(shots);
        std::fs::create_dir_all(&dir).expect("the screenshots' folder");
        dir.to_string_lossy().into_owned()
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console.py");
    let python = std::env::var("BETTER_COMPUTE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let mut browser = std::process::Command::new(python)
        .args([script, &server.base_url, &admin, &shots, &customer])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the browser driver (pip install selenium; apt install chromium chromium-driver)");
    let lines = crate::browser::lines_of(&mut browser);
    let mut say = browser.stdin.take().expect("stdin");
    let mut tell = |line: &str| writeln!(say, "{line}").and_then(|()| say.flush()).expect("tell the browser driver");
    let hear = |wanted: &str| tokio::task::block_in_place(|| expect_line(&lines, wanted));

    // The fleet lists every node; a cordon made through the API shows on the open page.
    assert_eq!(hear("fleet "), [nodes.len().to_string()], "a row per node");
    let node = nodes[0]["id"].as_str().expect("a node id").to_owned();
    call(reqwest::Method::POST, &format!("/v1/nodes/{node}/cordon"), json!({ "reason": "console test" })).await;
    tell(&format!("cordoned {node}"));
    assert!(hear("saw cordoned").is_empty());

    // A reservation made through the console's form is the caller's, and its detail lists its events.
    let reserved = hear("reserved ");
    let (rsv, pool) = (reserved[0].clone(), reserved[1].clone());
    let made = call(reqwest::Method::GET, &format!("/v1/reservations/{rsv}"), Value::Null).await;
    assert_eq!((made["poolId"].as_str(), made["count"].as_i64()), (Some(pool.as_str()), Some(2)), "{made}");
    assert_eq!(made["identity"], "ops@platform");
    let events: usize = hear("events ")[0].parse().expect("a count");
    assert!(events >= 4, "requested, placed, binding started and activated: {events}");

    // It shows in its pool's calendar; a reservation made through the API appears there without a reload.
    assert_eq!(hear("calendar "), [rsv]);
    let start =
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("now").as_secs() + 1800) * 1000;
    let body = json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 7200, "start": start });
    let other = client
        .post(format!("{base}/v1/reservations"))
        .bearer_auth(&admin)
        .header("idempotency-key", "console-test-other")
        .json(&body)
        .send()
        .await
        .expect("reserve");
    assert_eq!(other.status().as_u16(), 201);
    let other = other.json::<Value>().await.expect("a reservation")["id"].as_str().expect("an id").to_owned();
    tell(&format!("booking {other}"));
    assert_eq!(hear("saw booking "), std::slice::from_ref(&other));

    // The list's button ends it: the API says so too.
    let ended = hear("ended ");
    let after = call(reqwest::Method::GET, &format!("/v1/reservations/{other}"), Value::Null).await;
    assert_eq!(after["state"], "cancelled", "{after}");
    assert_eq!(ended, ["cancelled"]);

    // The audit trail lists entries; a node's detail shows its inventory's sections.
    let audit: usize = hear("audit ")[0].parse().expect("a count");
    assert!(audit >= 6, "{audit}");
    let sections = hear("node ");
    assert_eq!(sections, ["disks,gpus,nics,system"]);

    // Signed in as the demo customer, the same console shows the two pools offered to it, none of the
    // platform's machines, none of the administrator's reservations, nothing of their audit trail, and none of
    // the events the administrator's session listed.
    let tenant = hear("tenant ");
    assert_eq!(&tenant[..6], ["pools", "2", "nodes", "0", "reservations", "-"], "{tenant:?}");
    assert_eq!(&tenant[6..], ["audit-mentions-admin", "no", "feed-mentions-admin", "no"], "{tenant:?}");
    assert!(browser.wait().expect("the driver exits").success());
    server.signal("INT");
    assert!(server.wait().success());
    let _ = std::fs::remove_dir_all(&data_dir);
}
