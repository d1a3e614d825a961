//! Boundaries checked on the source: the HTTP layer reaches the database only through the write side's door.

use std::path::Path;

/// The words that would mean an HTTP module holds the database or runs SQL itself.
const FORBIDDEN: [&str; 5] = ["bc_eventstore::Db", "Db,", "sqlx", "sql::", "TxOptions"];

#[test]
fn no_http_module_holds_a_database_or_runs_sql() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("read src/http") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a module");
        for word in FORBIDDEN {
            assert!(!text.contains(word), "{} names {word:?}: HTTP goes through bc_commands::App", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} modules found under {}", dir.display());
}
