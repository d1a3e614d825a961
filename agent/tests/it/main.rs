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
