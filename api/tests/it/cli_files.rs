//! What the CLI reads and writes itself: its configuration file (the servers it knows and the current one) and
//! the fleet document `better-compute apply` compares with what the API holds.

use bc_api::cli::config::{CliConfig, ServerEntry};
use bc_api::cli::fleet::{FleetDocument, covers, overlay};
use serde_json::json;

#[test]
fn what_a_document_leaves_out_is_anything_and_numbers_compare_by_value() {
    let live = json!({ "maxPending": 10, "lostAfter": 30, "overcommit": { "vcpu": 2.0 } });
    assert!(covers(&live, &json!({ "maxPending": 10 })));
    assert!(covers(&live, &json!({ "overcommit": { "vcpu": 2 }, "admission": null })));
    assert!(!covers(&live, &json!({ "maxPending": 20 })));
    assert!(!covers(&live, &json!({ "acceptance": ["gpu-burn"] })), "a field the live value lacks differs");
    assert!(!covers(&json!([1, 2]), &json!([1])), "lists compare whole");
}

#[test]
fn an_overlay_changes_only_what_the_document_sets() {
    let live = json!({ "maxPending": 10, "lostAfter": 30, "overcommit": { "vcpu": 2.0, "memoryGiB": 1.0 } });
    let merged = overlay(&live, &json!({ "maxPending": 20, "overcommit": { "vcpu": 4.0 } }));
    assert_eq!(merged, json!({ "maxPending": 20, "lostAfter": 30, "overcommit": { "vcpu": 4.0, "memoryGiB": 1.0 } }));
}

#[test]
fn a_document_of_another_version_or_with_a_name_twice_is_refused_naming_it() {
    let err = FleetDocument::parse("apiVersion: v0\n").expect_err("version");
    assert!(err.to_string().contains("better-compute/v1"), "{err}");
    let twice = "apiVersion: better-compute/v1\nsites:\n- {name: a, iamRegion: r}\n- {name: a, iamRegion: r}\n";
    let err = FleetDocument::parse(twice).expect_err("twice");
    assert!(err.to_string().contains("site \"a\" twice"), "{err}");
    let unknown = "apiVersion: better-compute/v1\nsites:\n- {name: a, iamRegion: r, colour: blue}\n";
    let err = format!("{:#}", FleetDocument::parse(unknown).expect_err("unknown field"));
    assert!(err.contains("colour"), "{err}");
    let policy = "apiVersion: better-compute/v1\npools:\n- {name: p, site: a, class: metal-host, gpuModel: H100, policy: {maxPending: -1}}\n";
    let err = format!("{:#}", FleetDocument::parse(policy).expect_err("bad policy"));
    assert!(err.contains("pools[p].policy"), "{err}");
}

#[test]
fn a_configuration_round_trips_and_names_its_current_server() {
    let dir = std::env::temp_dir().join(format!("bc-cli-config-{}", std::process::id()));
    let path = dir.join("config.toml");
    let mut config = CliConfig::default();
    config.servers.insert(
        "dev".into(),
        ServerEntry { url: "https://127.0.0.1:8443".into(), token: Some("bct_x".into()), ca: Some("/ca.pem".into()) },
    );
    config.servers.insert("prod".into(), ServerEntry { url: "https://cp:8443".into(), ..Default::default() });
    config.current = Some("prod".into());
    config.save(&path).expect("save");
    let loaded = CliConfig::load(&path).expect("load");
    assert_eq!(loaded, config);
    assert_eq!(loaded.server(None).expect("current").0, "prod");
    assert_eq!(loaded.server(Some("dev")).expect("named").1.token.as_deref(), Some("bct_x"));
    let missing = loaded.server(Some("staging")).expect_err("unknown");
    assert!(missing.to_string().contains("known: dev, prod"), "{missing}");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_missing_file_is_empty_and_a_bad_one_is_named() {
    let dir = std::env::temp_dir().join(format!("bc-cli-config-bad-{}", std::process::id()));
    assert_eq!(CliConfig::load(&dir.join("absent.toml")).expect("empty"), CliConfig::default());
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "current = \"x\"\nservers = 3\n").expect("write");
    let err = CliConfig::load(&bad).expect_err("bad");
    assert!(err.to_string().contains("bad.toml is not a valid configuration"), "{err}");
    assert!(CliConfig::default().server(None).is_err(), "no server chosen");
    std::fs::remove_dir_all(dir).ok();
}
