//! The `bcd` binary as a process.

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
