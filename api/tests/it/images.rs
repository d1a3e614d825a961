//! Images through the API: an upload is stored only when its bytes match the declared SHA-256 and size (and its
//! signature, when it has one, an allow-listed signer's), is served back byte for byte, is its tenant's unless
//! the platform published it, and leaves nothing behind when it is refused or deleted.

use axum::body::Body;
use axum::http::StatusCode;
use bc_commands::images::{ImagePolicy, ImageSigners};
use bc_eventstore::{TxOptions, sql};
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::http_api::{Api, GUS, ROOT, Reply};

const MAX: u64 = 4 << 20;

fn signing_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn policy() -> ImagePolicy {
    ImagePolicy { signers: ImageSigners::none().with("release", signing_key(7).verifying_key()), max_bytes: MAX }
}

/// Bytes that cross chunk boundaries and are not all alike.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn signature(key: &SigningKey, data: &[u8]) -> String {
    hex::encode(key.sign(&Sha256::digest(data)).to_bytes())
}

async fn upload(api: &Api, token: &str, query: &str, data: Vec<u8>) -> Reply {
    let length = data.len().to_string();
    let headers = [("content-type", "application/octet-stream"), ("content-length", length.as_str())];
    api.call_raw("POST", &format!("/v1/images?{query}"), Some(token), &headers, Body::from(data)).await.0
}

/// What the image tables hold: images, uploads, chunks and blobs.
async fn rows(api: &Api) -> [i64; 4] {
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let mut counts = [0; 4];
    for (n, table) in ["images", "image_uploads", "image_chunks", "image_blobs"].iter().enumerate() {
        let query = match *table {
            "images" => "SELECT count(*) FROM images",
            "image_uploads" => "SELECT count(*) FROM image_uploads",
            "image_chunks" => "SELECT count(*) FROM image_chunks",
            _ => "SELECT count(*) FROM image_blobs",
        };
        counts[n] = sql::query_scalar(query).fetch_one(tx.conn()).await.expect("count");
    }
    tx.commit().await.expect("commit");
    counts
}

/// Makes tenant `id` below root with an administrator, and answers the administrator's token.
pub(crate) async fn customer(api: &Api, id: &str) -> String {
    let made = api.post("/v1/tenants", ROOT, json!({ "tenantId": id, "name": format!("{id} inc.") })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let boss = api
        .post(&format!("/v1/tenants/{id}/identities"), ROOT, json!({ "name": format!("boss@{id}"), "admin": true }))
        .await;
    let identity = boss.body["id"].as_str().expect("identity id");
    let token = api.post(&format!("/v1/tenants/{id}/identities/{identity}/tokens"), ROOT, json!({})).await;
    token.body["token"].as_str().expect("a token").to_owned()
}

#[tokio::test]
async fn an_image_is_stored_only_when_its_bytes_match_and_is_served_back_byte_for_byte() {
    let api = Api::with_images(policy()).await;
    let data = bytes(2_500_000, 1);
    let sha = sha256(&data);

    let stored = upload(&api, ROOT, &format!("name=ubuntu&version=24.04&format=raw&sha256={sha}"), data.clone()).await;
    assert_eq!(stored.status, StatusCode::CREATED, "{:?}", stored.body);
    let id = stored.body["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("img_"), "{id}");
    assert_eq!(stored.header("location"), Some(format!("/v1/images/{id}").as_str()));
    assert_eq!(
        (&stored.body["sha256"], &stored.body["sizeBytes"], &stored.body["verified"], &stored.body["visibility"]),
        (&json!(sha), &json!(2_500_000), &json!(false), &json!("private"))
    );
    assert_eq!(rows(&api).await, [1, 1, 3, 1], "one image, its upload of three chunks, one blob");

    let (got, served) = api.call_raw("GET", &format!("/v1/images/{id}/content"), Some(ROOT), &[], Body::empty()).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.header("etag"), Some(format!("\"sha256:{sha}\"").as_str()));
    assert_eq!(got.header("content-length"), Some("2500000"));
    assert!(served == data, "the bytes served are the bytes uploaded");
    let read = api.get(&format!("/v1/images/{id}"), ROOT).await;
    assert_eq!(read.body, stored.body);

    // The same upload again is the stored image; other bytes under the same name and version are a conflict.
    let again = upload(&api, ROOT, &format!("name=ubuntu&version=24.04&format=raw&sha256={sha}"), data.clone()).await;
    assert_eq!((again.status, &again.body["id"]), (StatusCode::OK, &json!(id)), "{:?}", again.body);
    let other = bytes(1000, 2);
    let query = format!("name=ubuntu&version=24.04&format=raw&sha256={}", sha256(&other));
    let conflict = upload(&api, ROOT, &query, other).await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{:?}", conflict.body);
    assert_eq!(rows(&api).await, [1, 1, 3, 1], "neither left anything behind");
}

#[tokio::test]
async fn bytes_that_do_not_match_what_the_upload_declares_are_refused_and_nothing_is_kept() {
    let api = Api::with_images(policy()).await;
    let data = bytes(1_500_000, 3);
    let sha = sha256(&data);
    let events = api.events().await;
    let wrong_sha = sha256(b"something else");
    for (query, body, status, field) in [
        (format!("name=a&version=1&format=raw&sha256={wrong_sha}"), data.clone(), StatusCode::BAD_REQUEST, "sha256"),
        (format!("name=a&version=1&format=raw&sha256={sha}&size=10"), data.clone(), StatusCode::BAD_REQUEST, "size"),
        (format!("name=A&version=1&format=raw&sha256={sha}"), data.clone(), StatusCode::BAD_REQUEST, "name"),
        (format!("name=a&version=1&format=vhd&sha256={sha}"), data.clone(), StatusCode::BAD_REQUEST, "format"),
        (
            format!("name=a&version=1&format=raw&sha256={}", sha.to_uppercase()),
            data.clone(),
            StatusCode::BAD_REQUEST,
            "sha256",
        ),
        (
            format!("name=a&version=1&format=raw&sha256={sha}&colour=red"),
            data.clone(),
            StatusCode::BAD_REQUEST,
            "colour",
        ),
        (format!("name=a&version=1&format=raw&sha256={sha}"), Vec::new(), StatusCode::BAD_REQUEST, "size"),
    ] {
        let refused = upload(&api, ROOT, &query, body).await;
        assert_eq!((refused.status, refused.field()), (status, field), "{query}: {:?}", refused.body);
    }
    // A declared size above the limit is refused before a byte is read.
    let query = format!("/v1/images?name=a&version=1&format=raw&sha256={sha}&size={}", MAX + 1);
    let stream = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(data.clone())]);
    let (declared, _) = api.call_raw("POST", &query, Some(ROOT), &[], Body::from_stream(stream)).await;
    assert_eq!((declared.status, declared.field()), (StatusCode::PAYLOAD_TOO_LARGE, "size"), "{:?}", declared.body);
    // Without a declared length, the limit stops the body as it arrives.
    let big = bytes(MAX as usize + 1, 4);
    let query = format!("/v1/images?name=big&version=1&format=raw&sha256={}", sha256(&big));
    let chunked =
        futures_util::stream::iter(big.chunks(65_536).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect::<Vec<_>>());
    let (too_big, _) = api
        .call_raw(
            "POST",
            &query,
            Some(ROOT),
            &[("content-type", "application/octet-stream")],
            Body::from_stream(chunked),
        )
        .await;
    assert_eq!((too_big.status, too_big.field()), (StatusCode::PAYLOAD_TOO_LARGE, "body"), "{:?}", too_big.body);
    // A body that breaks off midway is refused too.
    let broken = futures_util::stream::iter(vec![Ok(vec![1u8; 2_000_000]), Err(std::io::Error::other("cut"))]);
    let query = format!("/v1/images?name=cut&version=1&format=raw&sha256={sha}");
    let (cut, _) = api
        .call_raw(
            "POST",
            &query,
            Some(ROOT),
            &[("content-type", "application/octet-stream")],
            Body::from_stream(broken),
        )
        .await;
    assert_eq!((cut.status, cut.field()), (StatusCode::BAD_REQUEST, "body"), "{:?}", cut.body);
    // JSON is not an image; a key is not taken.
    let query = format!("/v1/images?name=a&version=1&format=raw&sha256={sha}");
    let (json_body, _) =
        api.call_raw("POST", &query, Some(ROOT), &[("content-type", "application/json")], Body::from("{}")).await;
    assert_eq!(json_body.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{:?}", json_body.body);
    let headers = [("content-type", "application/octet-stream"), ("idempotency-key", "k")];
    let (keyed, _) = api.call_raw("POST", &query, Some(ROOT), &headers, Body::from(data.clone())).await;
    assert_eq!((keyed.status, keyed.field()), (StatusCode::BAD_REQUEST, "Idempotency-Key"), "{:?}", keyed.body);

    assert_eq!(rows(&api).await, [0, 0, 0, 0], "no image, and no byte of any refused upload kept");
    assert_eq!(api.events().await, events, "nothing recorded");
}

#[tokio::test]
async fn a_signature_makes_an_image_verified_only_when_an_allowed_signer_made_it() {
    let api = Api::with_images(policy()).await;
    let data = bytes(300_000, 5);
    let sha = sha256(&data);
    let good = signature(&signing_key(7), &data);
    let stranger = signature(&signing_key(8), &data);
    let base = format!("name=signed&version=1&format=qcow2&sha256={sha}");
    for (extra, field) in [
        (format!("&signature={stranger}"), "signature"),
        (format!("&signature={stranger}&signer=release"), "signature"),
        (format!("&signature={good}&signer=nobody"), "signer"),
        ("&signature=abcd".to_owned(), "signature"),
        ("&signer=release".to_owned(), "signature"),
    ] {
        let refused = upload(&api, ROOT, &format!("{base}{extra}"), data.clone()).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{extra}: {:?}", refused.body);
    }
    assert_eq!(rows(&api).await, [0, 0, 0, 0]);
    // A signature over other bytes does not verify these, even by the allowed signer.
    let elsewhere = signature(&signing_key(7), b"other bytes");
    let refused = upload(&api, ROOT, &format!("{base}&signature={elsewhere}"), data.clone()).await;
    assert_eq!(refused.field(), "signature", "{:?}", refused.body);

    let verified = upload(&api, ROOT, &format!("{base}&signature={good}"), data.clone()).await;
    assert_eq!(verified.status, StatusCode::CREATED, "{:?}", verified.body);
    assert_eq!((&verified.body["verified"], &verified.body["signer"]), (&json!(true), &json!("release")));
}

#[tokio::test]
async fn private_images_are_their_tenants_and_public_ones_every_tenants_to_read() {
    let api = Api::with_images(policy()).await;
    let boss = customer(&api, "initech").await;
    let data = bytes(10_000, 6);
    let sha = sha256(&data);

    let private = upload(&api, &boss, &format!("name=app&version=1&format=raw&sha256={sha}"), data.clone()).await;
    assert_eq!(private.status, StatusCode::CREATED, "{:?}", private.body);
    let private_id = private.body["id"].as_str().expect("id").to_owned();
    // Only the platform publishes.
    let publish =
        upload(&api, &boss, &format!("name=app&version=2&format=raw&sha256={sha}&visibility=public"), data.clone())
            .await;
    assert_eq!(publish.status, StatusCode::FORBIDDEN, "{:?}", publish.body);
    let public =
        upload(&api, ROOT, &format!("name=base&version=1&format=iso&sha256={sha}&visibility=public"), data.clone())
            .await;
    assert_eq!(public.status, StatusCode::CREATED, "{:?}", public.body);
    let public_id = public.body["id"].as_str().expect("id").to_owned();
    assert_eq!(rows(&api).await, [2, 1, 1, 1], "two images, one copy of their bytes");

    // Another tenant sees the public image and not the private one; it changes neither.
    let ids = |reply: &Reply| -> Vec<String> {
        reply.body["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["id"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&api.get("/v1/images", GUS).await), std::slice::from_ref(&public_id));
    let mut both = vec![private_id.clone(), public_id.clone()];
    both.sort();
    assert_eq!(ids(&api.get("/v1/images", &boss).await), both);
    assert_eq!(api.get(&format!("/v1/images/{private_id}"), GUS).await.status, StatusCode::NOT_FOUND);
    let content = format!("/v1/images/{private_id}/content");
    assert_eq!(api.call_raw("GET", &content, Some(GUS), &[], Body::empty()).await.0.status, StatusCode::NOT_FOUND);
    assert_eq!(api.get(&format!("/v1/images/{public_id}"), GUS).await.status, StatusCode::OK);
    let (served, served_bytes) =
        api.call_raw("GET", &format!("/v1/images/{public_id}/content"), Some(GUS), &[], Body::empty()).await;
    assert_eq!(served.status, StatusCode::OK);
    assert!(served_bytes == data);
    let delete = api.call("DELETE", &format!("/v1/images/{public_id}"), Some(GUS), &[], None).await;
    assert_eq!(delete.status, StatusCode::NOT_FOUND, "{:?}", delete.body);

    // Deleting one image keeps the bytes the other has; deleting both frees them.
    let gone = api.call("DELETE", &format!("/v1/images/{public_id}"), Some(ROOT), &[], None).await;
    assert_eq!(gone.status, StatusCode::OK, "{:?}", gone.body);
    assert_eq!(api.get(&format!("/v1/images/{public_id}"), ROOT).await.status, StatusCode::NOT_FOUND);
    assert_eq!(rows(&api).await, [1, 1, 1, 1]);
    let (still, still_bytes) = api.call_raw("GET", &content, Some(&boss), &[], Body::empty()).await;
    assert!(still.status == StatusCode::OK && still_bytes == data);
    let gone = api.call("DELETE", &format!("/v1/images/{private_id}"), Some(&boss), &[], None).await;
    assert_eq!(gone.status, StatusCode::OK, "{:?}", gone.body);
    assert_eq!(rows(&api).await, [0, 0, 0, 0]);
    let again = api.call("DELETE", &format!("/v1/images/{private_id}"), Some(&boss), &[], None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    // The name is free again, and the images table is what the log rebuilds.
    let reused = upload(&api, &boss, &format!("name=app&version=1&format=raw&sha256={sha}"), data.clone()).await;
    assert_eq!(reused.status, StatusCode::CREATED, "{:?}", reused.body);
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    bc_projections::inline::rebuild_into(&mut tx, "images_rebuild").await.expect("rebuild");
    let differences = bc_projections::inline::differences(&mut tx, "images_rebuild", "images").await.expect("compare");
    assert_eq!(differences, 0, "images rebuilt from the log differ from the live table");
    tx.rollback().await;
}

#[tokio::test]
async fn an_upload_whose_writer_died_is_swept_and_a_stored_one_is_not() {
    let api = Api::with_images(policy()).await;
    let data = bytes(1000, 9);
    let stored = upload(&api, ROOT, &format!("name=kept&version=1&format=raw&sha256={}", sha256(&data)), data).await;
    assert_eq!(stored.status, StatusCode::CREATED);
    // What a process that died mid-upload leaves: an upload and a chunk, no blob.
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    for statement in [
        "INSERT INTO image_uploads (id, tenant_id, started_at, touched_at)
         VALUES ('dead', 'root', compute_now() - interval '1 hour', compute_now() - interval '1 hour')",
        "INSERT INTO image_uploads (id, tenant_id, started_at, touched_at)
         VALUES ('busy', 'root', compute_now() - interval '1 hour', compute_now())",
        "INSERT INTO image_chunks (upload_id, seq, data) VALUES ('dead', 0, '\\x00')",
    ] {
        sql::query(statement).execute(tx.conn()).await.expect("insert");
    }
    tx.commit().await.expect("commit");
    assert_eq!(rows(&api).await, [1, 3, 2, 1]);
    let app = bc_commands::App::new(api.fleet.t.db.clone());
    assert_eq!(app.sweep_image_uploads().await.expect("sweep"), 1, "the dead upload only");
    assert_eq!(rows(&api).await, [1, 2, 1, 1], "the stored image's upload and the one still arriving stay");
}

#[test]
fn a_signer_allowlist_is_read_from_pem_public_keys_and_bad_entries_are_named() {
    use ed25519_dalek::pkcs8::EncodePublicKey as _;
    let pem = signing_key(7).verifying_key().to_public_key_pem(Default::default()).expect("pem");
    let file = format!("[[signer]]\nname = \"release\"\npublic-key = \"\"\"\n{pem}\"\"\"\n");
    let signers = ImageSigners::parse(&file).expect("parsed");
    assert_eq!(signers.names(), ["release"]);
    let twice = format!("{file}{file}");
    assert!(ImageSigners::parse(&twice).expect_err("twice").contains("named twice"));
    let bad = "[[signer]]\nname = \"x\"\npublic-key = \"not a key\"\n";
    assert!(ImageSigners::parse(bad).expect_err("bad").contains("public-key"));
    assert!(ImageSigners::parse("[[signers]]\n").is_err(), "an unknown table is refused");
}

/// A body that sends `first` and then nothing, ever: a client trickling its request.
fn stalled(first: &'static [u8]) -> Body {
    let head = futures_util::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from_static(first))]);
    Body::from_stream(futures_util::StreamExt::chain(head, futures_util::stream::pending()))
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_refused_naming_the_body_and_writes_nothing() {
    use tower::ServiceExt as _;

    let api = Api::with_images(policy()).await;
    let mut state = bc_api::http::AppState::new(api.app.clone()).expect("state");
    state.body_deadline = std::time::Duration::from_millis(300);
    let router = bc_api::http::router(state);
    let send = |method: &str, uri: &str, headers: &[(&str, &str)], body: Body| {
        let mut request =
            axum::http::Request::builder().method(method).uri(uri).header("authorization", format!("Bearer {ROOT}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(body).expect("request");
        let router = router.clone();
        async move {
            let response = tokio::time::timeout(std::time::Duration::from_secs(30), router.oneshot(request))
                .await
                .expect("a trickled body was waited for without end")
                .expect("response");
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
            (status, serde_json::from_slice::<serde_json::Value>(&bytes).expect("JSON"))
        }
    };
    let json = [("content-type", "application/json"), ("content-length", "100")];

    let (_, before) = send("GET", "/v1/sites", &[], Body::empty()).await;

    // A JSON body, read by the handler's extractor and by the create routes' idempotency layer.
    let (status, body) = send("PATCH", "/v1/pools/pool_01j0000000000000000000000", &json, stalled(b"{\"na")).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "REQUEST_TIMEOUT", "{body}");
    assert_eq!(body["error"]["details"]["field"], "body", "{body}");
    let keyed = [json[0], json[1], ("idempotency-key", "trickle-1")];
    let (status, body) = send("POST", "/v1/sites", &keyed, stalled(b"{\"na")).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(body["error"]["details"]["field"], "body", "{body}");

    // An upload may take its time, but not go silent.
    let data = bytes(1000, 1);
    let query = format!("/v1/images?name=slow&version=1&format=raw&sha256={}", sha256(&data));
    let upload = [("content-type", "application/octet-stream"), ("content-length", "1000")];
    let (status, body) = send("POST", &query, &upload, stalled(&[1, 2, 3])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["details"]["field"], "body", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("nothing arrived for 300 ms")), "{body}");
    assert_eq!(rows(&api).await, [0, 0, 0, 0], "a stalled upload leaves nothing behind");
    let (status, after) = send("GET", "/v1/sites", &[], Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(after["items"], before["items"], "no site was made");
}
