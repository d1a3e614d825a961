//! The `bcd` binary as a process, and the BMC drivers against emulators (`bmc`).

mod bmc;
mod boot;

use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_bcd");

#[test]
fn help_describes_the_agent() {
    let output = Command::new(BINARY).arg("--help").output().expect("run");
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("node agent"));
}

#[test]
fn no_arguments_prints_help_and_fails() {
    let output = Command::new(BINARY).output().expect("run");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("Usage"));
}

#[test]
fn version_names_the_binary() {
    let output = Command::new(BINARY).arg("version").output().expect("run");
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("bcd "));
}

#[test]
fn a_simulated_inventory_is_a_node_inventory_v1_document_with_section_hashes() {
    let output =
        Command::new(BINARY).args(["inventory", "--simulate", "8xH100", "--hostname", "gpu-7"]).output().expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(printed["document"]["schema"], "NodeInventory/v1");
    assert_eq!(printed["document"]["system"]["hostname"], "gpu-7");
    assert_eq!(printed["document"]["gpus"].as_array().expect("gpus").len(), 8);
    assert_eq!(printed["document"]["gpus"][0]["name"], "NVIDIA H100 80GB HBM3");
    for section in ["system", "gpus", "nics", "disks"] {
        assert!(printed["hashes"][section].as_str().is_some_and(|h| h.starts_with("sha256:")), "{section}");
    }
}

#[test]
fn a_bad_simulation_spec_names_what_is_wrong() {
    let output = Command::new(BINARY).args(["inventory", "--simulate", "8xZ9000"]).output().expect("run");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("Z9000"));
}

#[test]
fn run_needs_the_control_planes_ca_or_an_explicit_insecure_http() {
    let output = Command::new(BINARY)
        .args(["run", "--server", "https://127.0.0.1:1", "--state-dir", "/nonexistent"])
        .env_remove("BCD_CA")
        .output()
        .expect("run");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("--ca"), "{text}");
}

#[test]
fn the_agents_client_refuses_a_scheme_its_trust_does_not_fit_and_builds_without_a_process_provider() {
    use bc_agent::run::{Client, ServerTrust};
    // No crypto provider is installed in this test process: the plain HTTP client must still build.
    assert!(Client::new("http://127.0.0.1:1", &ServerTrust::InsecureHttp).is_ok());
    let https = Client::new("https://127.0.0.1:1", &ServerTrust::InsecureHttp).expect_err("https with insecure");
    assert!(https.to_string().contains("not http://"), "{https}");
    let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_owned();
    let http = Client::new("http://127.0.0.1:1", &ServerTrust::PinnedCa(ca)).expect_err("http with a pinned CA");
    assert!(http.to_string().contains("not https://"), "{http}");
}
