//! The kubectl-style CLI (`better-compute get|describe|reserve|cancel|release|cordon|uncordon|drain|config|
//! completion`) as a real process talking to a real server over TLS, with the contexts `dev` wrote.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::process::command;

/// Runs the CLI with `config` as its configuration file.
fn cli(config: &Path, args: &[&str]) -> Output {
    command(args).env("BETTER_COMPUTE_CONFIG", config).env_remove("BETTER_COMPUTE_TOKEN").output().expect("run the CLI")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "the CLI failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The one line a failed command printed.
fn failure(output: &Output) -> String {
    assert!(!output.status.success(), "expected a failure: {}", String::from_utf8_lossy(&output.stdout));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

fn json(output: &Output) -> Value {
    serde_json::from_str(&stdout(output)).expect("JSON")
}

/// Called by the `dev` test once its machines are live: `dev` wrote the contexts `dev` (the administrator)
/// and `dev-demo` (the demo customer) into `config`.
pub(crate) async fn the_cli_lists_reserves_describes_and_drains_through_the_api(config: &Path) {
    let view = stdout(&cli(config, &["config", "view"]));
    assert!(view.contains("* dev\thttps://") && view.contains("dev-demo"), "{view}");
    let me = stdout(&cli(config, &["whoami", "--context", "dev-demo"]));
    assert!(me.contains("tenant:   acme\n") && me.contains("identity: alice@acme"), "{me}");
    assert!(stdout(&cli(config, &["whoami"])).contains("tenant:   root (the platform)"));

    // get, in every output format.
    let table = stdout(&cli(config, &["get", "pools", "--context", "dev-demo"]));
    let mut lines = table.lines();
    let header = lines.next().expect("a header");
    assert!(header.starts_with("ID") && header.contains("NAME") && header.contains("SHARING"), "{table}");
    let mut names: Vec<&str> = lines.map(|line| line.split_whitespace().nth(1).unwrap_or("")).collect();
    names.sort_unstable();
    assert_eq!(names, ["a100", "h100"], "{table}");
    let pools = json(&cli(config, &["get", "pools", "--context", "dev-demo", "-o", "json"]));
    let h100 = pools["items"].as_array().expect("items").iter().find(|p| p["name"] == "h100").expect("h100");
    let pool = h100["id"].as_str().expect("id").to_owned();
    let named = stdout(&cli(config, &["get", "pools", "--context", "dev-demo", "-o", "name"]));
    assert!(named.lines().all(|line| line.starts_with("pool/pool_")) && named.contains(&pool), "{named}");
    let wide = stdout(&cli(config, &["get", "nodes", "-o", "wide", "--pool", &pool]));
    assert!(wide.lines().next().unwrap_or("").contains("CORDONED"), "{wide}");
    assert_eq!(wide.lines().skip(1).filter(|line| line.contains("connected")).count(), 3, "{wide}");
    let yaml = stdout(&cli(config, &["get", "nodes", "-o", "yaml", "--pool", &pool]));
    assert!(yaml.starts_with("items:") && yaml.contains("connectivity: connected"), "{yaml}");

    // reserve: a dry run quotes and reserves nothing, then its quote is booked as printed.
    let dry = stdout(&cli(
        config,
        &["reserve", "--context", "dev-demo", "--pool", &pool, "--count", "2", "--duration", "1h", "--dry-run"],
    ));
    assert!(dry.contains("earliest start:") && dry.contains("devices: ") && dry.contains(" on node_"), "{dry}");
    let none = json(&cli(config, &["get", "reservations", "--context", "dev-demo", "-o", "json"]));
    assert_eq!(none["items"].as_array().map(Vec::len), Some(0), "a dry run reserved nothing: {none}");
    let quoted = dry.lines().find_map(|line| line.strip_prefix("devices: ")).expect("the quoted devices").to_owned();
    let book = dry.lines().find_map(|line| line.strip_prefix("book it: better-compute ")).expect("the command");
    let mut args: Vec<&str> = book.split(' ').collect();
    args.extend(["--context", "dev-demo", "-o", "json"]);
    let made = json(&cli(config, &args));
    let reservation = made["id"].as_str().expect("a reservation id").to_owned();
    let devices: Vec<&str> =
        made["allocations"][0]["devices"].as_array().expect("devices").iter().filter_map(Value::as_str).collect();
    let node = made["allocations"][0]["nodeId"].as_str().expect("a node");
    assert_eq!(format!("{} on {node}", devices.join(", ")), quoted, "booked exactly what the dry run quoted");

    // A watch prints the list, then each change as its row: a second reservation appears on it.
    let mut watch = command(&["get", "reservations", "--context", "dev-demo", "-w"])
        .env("BETTER_COMPUTE_CONFIG", config)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start a watch");
    let seen = crate::browser::lines_of(&mut watch);
    let wait = std::time::Duration::from_secs(60);
    let header = seen.recv_timeout(wait).expect("the watch's header");
    assert!(header.starts_with("ID") && header.contains("STATE"), "{header}");
    assert!(seen.recv_timeout(wait).expect("the first reservation").starts_with(&reservation));
    // Tomorrow, so that it can still be cancelled.
    let tomorrow =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + std::time::Duration::from_secs(86_400))
            .to_string();
    let second = json(&cli(
        config,
        &[
            "reserve",
            "--context",
            "dev-demo",
            "--pool",
            &pool,
            "--count",
            "1",
            "--duration",
            "30m",
            "--start",
            &tomorrow,
            "-o",
            "json",
        ],
    ));
    let second = second["id"].as_str().expect("a second reservation").to_owned();
    loop {
        let line = seen.recv_timeout(wait).expect("the second reservation on the watch");
        if line.starts_with(&second) {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let cancelled = stdout(&cli(config, &["cancel", &second, "--context", "dev-demo", "--reason", "cli test"]));
    assert!(cancelled.starts_with(&format!("reservation/{second} ")), "{cancelled}");
    let listed = stdout(&cli(config, &["get", "reservations", "--context", "dev-demo", "-o", "name"]));
    assert!(listed.lines().any(|line| line == format!("reservation/{reservation}")), "{listed}");
    let described = stdout(&cli(config, &["describe", &reservation, "--context", "dev-demo"]));
    assert!(described.contains("Allocations:") && described.contains(" on node_"), "{described}");
    assert!(described.contains("reservation.requested") && described.contains("reservation.placed"), "{described}");
    assert!(
        described.contains("Why:            placed on node_") && described.contains("  Quota:        quota "),
        "{described}"
    );
    let on = made["allocations"][0]["nodeId"].as_str().expect("placed on a node").to_owned();

    // Errors are one line naming the problem.
    let missing = failure(&cli(
        config,
        &["get", "reservation", "rsv_sgx0czkz59dsgmjqeh10x92q4khpnsh6cekyp2xwpe51rxcczxb1", "--context", "dev-demo"],
    ));
    assert!(missing.contains("NOT_FOUND"), "{missing}");
    let bad = failure(&cli(config, &["get", "pools", "--context", "staging"]));
    assert!(bad.contains("no server named \"staging\""), "{bad}");
    let refused = failure(&cli(config, &["cordon", &on, "--context", "dev-demo"]));
    assert!(refused.contains("FORBIDDEN") || refused.contains("NOT_FOUND"), "a customer cannot cordon: {refused}");

    // The administrator drains another node of the pool: nothing runs there, so it is drained at once.
    let nodes = json(&cli(config, &["get", "nodes", "--pool", &pool, "-o", "json"]));
    let other = nodes["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| n["id"].as_str().unwrap_or("").to_owned())
        .find(|id| *id != on)
        .expect("another node");
    let drained = stdout(&cli(config, &["drain", &other, "--reason", "cli test"]));
    assert_eq!(drained.trim(), format!("node/{other} drained"));
    let node = json(&cli(config, &["get", "node", &other, "-o", "json"]));
    assert_eq!((&node["cordoned"], &node["draining"]), (&Value::Bool(true), &Value::Bool(false)), "{node}");
    assert!(stdout(&cli(config, &["uncordon", &other])).contains("uncordoned"));
    let node = json(&cli(config, &["get", "node", &other, "-o", "json"]));
    assert_eq!(node["cordoned"], Value::Bool(false), "{node}");

    the_fleet_is_exported_planned_and_applied_as_code(config);

    // The customer ends its reservation once its node's agent bound it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let state = json(&cli(config, &["get", "reservation", &reservation, "--context", "dev-demo", "-o", "json"]));
        if state["state"] == "active" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never active: {state}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let ended = stdout(&cli(config, &["release", &reservation, "--context", "dev-demo"]));
    assert!(ended.starts_with(&format!("reservation/{reservation} ")), "{ended}");

    // The GPU-hour ledger: the customer sees its own rows, as JSON and CSV; the platform every tenant's, as tables.
    let ledger = json(&cli(config, &["ledger", "--context", "dev-demo", "-o", "json"]));
    let rows = ledger["tenants"].as_array().expect("tenants");
    assert!(rows.iter().all(|row| row["tenantId"] == "acme"), "{ledger}");
    assert!(rows.iter().any(|row| row["poolId"] == pool.as_str() && row["booked"].as_f64() > Some(0.0)), "{ledger}");
    let csv = stdout(&cli(config, &["ledger", "--context", "dev-demo", "--pool", &pool, "-o", "csv"]));
    assert!(csv.starts_with("pool_id,tenant_id,hour,capacity,booked,bound,idle,free,utilization\n"), "{csv}");
    assert!(csv.lines().any(|line| line.starts_with(&format!("{pool},acme,"))), "{csv}");
    let table = stdout(&cli(config, &["ledger", "--pool", &pool]));
    assert!(table.contains("CAPACITY") && table.contains("BOUND") && table.contains(" acme "), "{table}");
}

#[test]
fn completion_scripts_name_the_commands_for_each_shell() {
    for (shell, marker) in
        [("bash", "complete -F"), ("zsh", "#compdef better-compute"), ("fish", "complete -c better-compute")]
    {
        let output = command(&["completion", shell]).output().expect("run");
        let script = stdout(&output);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("describe") && script.contains("reserve"), "{shell}");
    }
}

#[test]
fn a_bad_duration_and_a_server_that_is_not_a_url_are_refused_naming_them() {
    let dir = bc_eventstore::testing::server().scratch_dir("cli-bad-input");
    let config = dir.join("config.toml");
    let output = cli(&config, &["reserve", "--pool", "pool_x", "--duration", "soon"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("\"soon\" is not a duration"), "{output:?}");
    let refused = failure(&cli(&config, &["config", "set-server", "x", "--url", "ftp://host"]));
    assert!(refused.contains("is not an http:// or https:// URL"), "{refused}");
    let nothing = failure(&cli(&config, &["get", "pools"]));
    assert!(nothing.contains("no server chosen"), "{nothing}");
    let https = cli(&config, &["config", "set-server", "prod", "--url", "https://127.0.0.1:1"]);
    let _ = stdout(&https);
    let no_ca = failure(&cli(&config, &["get", "pools"]));
    assert!(no_ca.contains("give the CA"), "{no_ca}");
}

/// `fleet export | plan | apply` as the platform administrator of `dev`'s fleet.
fn the_fleet_is_exported_planned_and_applied_as_code(config: &Path) {
    let dir = config.parent().expect("the configuration's folder").to_path_buf();
    let exported = stdout(&cli(config, &["fleet", "export"]));
    let mut document: Value = yaml_serde::from_str(&exported).expect("the export is YAML");
    assert_eq!(document["apiVersion"], "better-compute/v1");
    let pool_names: Vec<&str> =
        document["pools"].as_array().expect("pools").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(pool_names.len(), 2, "{exported}");
    let file = dir.join("fleet.yaml");
    std::fs::write(&file, &exported).expect("write the document");
    let path = file.to_str().expect("a path");
    let unchanged = stdout(&cli(config, &["fleet", "plan", "-f", path]));
    assert!(unchanged.starts_with("No changes"), "the export applies as no change: {unchanged}");

    // A new site with a pool offered to the demo customer, a policy changed, a quota raised.
    document["sites"].as_array_mut().expect("sites").push(serde_json::json!({ "name": "lab", "iamRegion": "local-1" }));
    document["pools"].as_array_mut().expect("pools").push(serde_json::json!({
        "name": "l40s", "site": "lab", "class": "metal-host", "gpuModel": "L40S",
        "policy": { "maxPending": 5 },
        "offers": [{ "tenantId": "acme", "quota": { "gpu": 4 } }],
    }));
    let pools = document["pools"].as_array_mut().expect("pools");
    let h100 = pools.iter_mut().find(|p| p["name"] == "h100").expect("h100");
    h100["policy"]["maxPending"] = serde_json::json!(7);
    let a100 = pools.iter_mut().find(|p| p["name"] == "a100").expect("a100");
    a100["offers"][0]["quota"]["gpu"] = serde_json::json!(1234);
    std::fs::write(&file, serde_json::to_string_pretty(&document).expect("JSON")).expect("write the document");
    let planned = stdout(&cli(config, &["fleet", "plan", "-f", path]));
    for line in [
        "+ site lab",
        "+ pool l40s (site lab, metal-host, L40S",
        "+ offer of pool l40s to acme",
        "~ pool h100: policy.maxPending",
        "~ offer of pool a100 to acme",
        "Plan: 3 to add, 2 to change, 0 to remove",
    ] {
        assert!(planned.contains(line), "{line:?} in {planned}");
    }
    let applied = stdout(&cli(config, &["fleet", "apply", "-f", path]));
    assert!(applied.trim_end().ends_with("Applied."), "{applied}");
    for args in [&["fleet", "plan", "-f", path][..], &["fleet", "apply", "-f", path][..]] {
        let again = stdout(&cli(config, args));
        assert!(again.starts_with("No changes"), "twice is a no-op: {again}");
    }
    let live = json(&cli(config, &["get", "pools", "-o", "json"]));
    let l40s = live["items"].as_array().expect("items").iter().find(|p| p["name"] == "l40s").expect("l40s made");
    assert_eq!(l40s["policy"]["maxPending"], 5, "{l40s}");
    assert_eq!(l40s["offers"][0]["tenantId"], "acme", "{l40s}");

    // Without --prune, what the document no longer names is kept; with it, removed.
    let a100 = document["pools"].as_array_mut().expect("pools").iter_mut().find(|p| p["name"] == "a100").expect("a100");
    a100["offers"] = serde_json::json!([]);
    std::fs::write(&file, serde_json::to_string_pretty(&document).expect("JSON")).expect("write the document");
    let kept = stdout(&cli(config, &["fleet", "plan", "-f", path]));
    assert!(kept.contains("offer of pool a100 to acme (not in the document: kept"), "{kept}");
    let pruned = stdout(&cli(config, &["fleet", "apply", "--prune", "-f", path]));
    assert!(pruned.contains("- offer of pool a100 to acme"), "{pruned}");
    assert!(stdout(&cli(config, &["fleet", "plan", "--prune", "-f", path])).starts_with("No changes"));

    // What cannot change is refused, naming it, and nothing is applied.
    let h100 = document["pools"].as_array_mut().expect("pools").iter_mut().find(|p| p["name"] == "h100").expect("h100");
    h100["gpuModel"] = serde_json::json!("B200");
    std::fs::write(&file, serde_json::to_string_pretty(&document).expect("JSON")).expect("write the document");
    let refused = failure(&cli(config, &["fleet", "apply", "-f", path]));
    assert!(refused.contains("pool h100: gpuModel cannot change (H100 → B200)"), "{refused}");
}
