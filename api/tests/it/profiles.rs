//! Profiles through the API: a name's versions count up and never change, the image a profile deploys is the
//! tenant's own or a public one and verified unless the profile says otherwise, an image a profile deploys is
//! not deleted under it, and bad input is refused naming the field.

use axum::body::Body;
use axum::http::StatusCode;
use bc_commands::images::{ImagePolicy, ImageSigners};
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::http_api::{Api, GUS, ROOT};
use crate::images::customer;

fn policy() -> ImagePolicy {
    let key = SigningKey::from_bytes(&[7; 32]);
    ImagePolicy { signers: ImageSigners::none().with("release", key.verifying_key()), max_bytes: 1 << 20 }
}

/// Uploads `data` as `name@1` by `token`, signed when asked; answers the image id.
async fn image(api: &Api, token: &str, name: &str, data: &[u8], signed: bool, public: bool) -> String {
    let digest = Sha256::digest(data);
    let mut query = format!("name={name}&version=1&format=raw&sha256={}", hex::encode(digest));
    if signed {
        let signature = SigningKey::from_bytes(&[7; 32]).sign(&digest);
        query.push_str(&format!("&signature={}", hex::encode(signature.to_bytes())));
    }
    if public {
        query.push_str("&visibility=public");
    }
    let headers = [("content-type", "application/octet-stream")];
    let (reply, _) =
        api.call_raw("POST", &format!("/v1/images?{query}"), Some(token), &headers, Body::from(data.to_vec())).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    reply.body["id"].as_str().expect("id").to_owned()
}

fn metal(name: &str, image: &str) -> Value {
    json!({
        "name": name,
        "target": "metal",
        "drivers": { "power": "redfish", "boot": "redfish", "deploy": "bcd", "inspect": "bcd" },
        "imageId": image,
        "userData": "#cloud-config\n",
        "steps": [
            { "name": "network-boot", "action": "boot-from-network" },
            { "name": "power-on", "action": "power-reset", "attempts": 3, "timeoutS": 120 },
            { "name": "write", "action": "write-image", "runsOn": "ramdisk" },
            { "name": "boot-disk", "action": "boot-from-disk", "waitFor": "rejoin" }
        ],
        "hostConfig": { "hostname": "gpu-{index}" },
        "acceptance": ["gpu-count=8"]
    })
}

#[tokio::test]
async fn a_profile_s_versions_count_up_and_each_reads_back_as_created() {
    let api = Api::with_images(policy()).await;
    let img = image(&api, ROOT, "os", b"signed bytes", true, false).await;
    let first = api.post("/v1/profiles", ROOT, metal("gpu-node", &img)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert_eq!((&first.body["version"], &first.body["steps"][0]["runsOn"]), (&json!(1), &json!("site")));
    assert_eq!((&first.body["steps"][0]["timeoutS"], &first.body["steps"][0]["attempts"]), (&json!(600), &json!(1)));
    let id = first.body["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("prof_"), "{id}");
    let second = api.post("/v1/profiles", ROOT, metal("gpu-node", &img)).await;
    assert_eq!(second.body["version"], 2, "{:?}", second.body);
    let other = api.post("/v1/profiles", ROOT, metal("cpu-node", &img)).await;
    assert_eq!(other.body["version"], 1);
    assert_eq!(api.get(&format!("/v1/profiles/{id}"), ROOT).await.body, first.body);

    // Listed by name and version, a page at a time; `?name=` keeps one profile's versions.
    let page = api.get("/v1/profiles?limit=2", ROOT).await;
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|p| format!("{}@{}", p["name"].as_str().unwrap_or(""), p["version"]))
            .collect()
    };
    assert_eq!(names(&page.body), ["cpu-node@1", "gpu-node@1"]);
    let cursor = page.body["nextCursor"].as_str().expect("a next page").to_owned();
    assert_eq!(names(&api.get(&format!("/v1/profiles?limit=2&cursor={cursor}"), ROOT).await.body), ["gpu-node@2"]);
    assert_eq!(names(&api.get("/v1/profiles?name=gpu-node", ROOT).await.body), ["gpu-node@1", "gpu-node@2"]);
    // Another tenant sees none of them.
    assert_eq!(api.get(&format!("/v1/profiles/{id}"), GUS).await.status, StatusCode::NOT_FOUND);
    assert_eq!(names(&api.get("/v1/profiles", GUS).await.body), Vec::<String>::new());

    // A deleted version's number is not given again.
    let second_id = second.body["id"].as_str().expect("id");
    let deleted = api.call("DELETE", &format!("/v1/profiles/{second_id}"), Some(ROOT), &[], None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    assert_eq!(api.get(&format!("/v1/profiles/{second_id}"), ROOT).await.status, StatusCode::NOT_FOUND);
    let third = api.post("/v1/profiles", ROOT, metal("gpu-node", &img)).await;
    assert_eq!(third.body["version"], 3, "{:?}", third.body);
}

#[tokio::test]
async fn a_profile_deploys_a_visible_verified_image_and_keeps_it_from_deletion() {
    let api = Api::with_images(policy()).await;
    let unverified = image(&api, ROOT, "plain", b"plain bytes", false, false).await;
    let refused = api.post("/v1/profiles", ROOT, metal("p", &unverified)).await;
    assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, "imageId"), "{:?}", refused.body);
    let mut allowed = metal("p", &unverified);
    allowed["allowUnverifiedImage"] = json!(true);
    let made = api.post("/v1/profiles", ROOT, allowed).await;
    assert_eq!(made.status, StatusCode::CREATED, "explicitly allowed: {:?}", made.body);

    // Another tenant's private image is not found; a public one is every tenant's to deploy.
    let public = image(&api, ROOT, "public-os", b"public bytes", true, true).await;
    let private = image(&api, ROOT, "private-os", b"private bytes", true, false).await;
    let boss = customer(&api, "initech").await;
    let theirs = api.post("/v1/profiles", &boss, metal("p", &private)).await;
    assert_eq!((theirs.status, theirs.field()), (StatusCode::BAD_REQUEST, "imageId"), "{:?}", theirs.body);
    let shared = api.post("/v1/profiles", &boss, metal("p", &public)).await;
    assert_eq!(shared.status, StatusCode::CREATED, "{:?}", shared.body);
    // A member who is not an administrator makes no profile.
    assert_eq!(api.post("/v1/profiles", GUS, metal("p", &public)).await.status, StatusCode::FORBIDDEN);

    // The image a live profile deploys stays; once the profile goes, the image may go.
    let profile = made.body["id"].as_str().expect("id");
    let blocked = api.call("DELETE", &format!("/v1/images/{unverified}"), Some(ROOT), &[], None).await;
    assert_eq!(blocked.status, StatusCode::CONFLICT, "{:?}", blocked.body);
    assert!(blocked.body["error"]["message"].as_str().unwrap_or("").contains(profile));
    api.call("DELETE", &format!("/v1/profiles/{profile}"), Some(ROOT), &[], None).await;
    let freed = api.call("DELETE", &format!("/v1/images/{unverified}"), Some(ROOT), &[], None).await;
    assert_eq!(freed.status, StatusCode::OK, "{:?}", freed.body);
}

#[tokio::test]
async fn bad_profiles_are_refused_naming_the_field_and_record_nothing() {
    let api = Api::with_images(policy()).await;
    let img = image(&api, ROOT, "os", b"signed bytes", true, false).await;
    let events = api.events().await;
    let with = |path: &[&str], value: Value| {
        let mut body = metal("p", &img);
        let mut at = &mut body;
        for key in &path[..path.len() - 1] {
            at = if let Ok(n) = key.parse::<usize>() { &mut at[n] } else { &mut at[*key] };
        }
        at[path[path.len() - 1]] = value;
        body
    };
    for (body, field) in [
        (with(&["drivers", "power"], json!("telnet")), "drivers.power"),
        (with(&["drivers", "deploy"], json!("ipmi")), "drivers.deploy"),
        (with(&["drivers", "teleport"], json!("bcd")), "drivers"),
        (with(&["steps", "2", "runsOn"], json!("site")), "steps[2].runsOn"),
        (with(&["steps", "0", "action"], json!("dance")), "steps[0].action"),
        (with(&["steps", "1", "name"], json!("network-boot")), "steps[1].name"),
        (with(&["steps", "1", "attempts"], json!(11)), "steps[1].attempts"),
        (with(&["steps", "0", "colour"], json!(1)), "steps[0].colour"),
        (with(&["name"], json!("Gpu Node")), "name"),
        (with(&["imageId"], json!("img_nope")), "imageId"),
        (with(&["target"], json!("cloud")), "target"),
        (with(&["acceptance"], json!(["gpus=8"])), "acceptance[0]"),
        (with(&["hostConfig", "hostname"], json!("a\u{0007}b")), "hostConfig.hostname"),
        (with(&["userData"], json!("x".repeat(40_000))), "userData"),
        (with(&["colour"], json!("red")), "colour"),
    ] {
        let refused = api.post("/v1/profiles", ROOT, body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{field}: {:?}", refused.body);
        assert!(refused.field().starts_with(field), "{field}: {:?}", refused.body);
    }
    let mut no_image = metal("p", &img);
    no_image.as_object_mut().expect("object").remove("imageId");
    let refused = api.post("/v1/profiles", ROOT, no_image).await;
    assert_eq!(refused.field(), "imageId", "{:?}", refused.body);
    assert_eq!(api.events().await, events, "nothing recorded");
}
