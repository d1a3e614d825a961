//! The one-clock rule, checked over the whole repository: no SQL reads the clock except through
//! `compute_now()`, outside the migration that defines it.

use std::path::{Path, PathBuf};

/// Words that read the clock directly, spelled here in pieces so this file does not trip its own check.
fn forbidden() -> Vec<String> {
    vec![
        ["current", "_timestamp"].concat(),
        ["clock", "_timestamp("].concat(),
        ["transaction", "_timestamp("].concat(),
        ["statement", "_timestamp("].concat(),
        ["local", "timestamp"].concat(),
        ["'", "now", "'"].concat(),
    ]
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | ".git" | "node_modules") {
                files(&path, out);
            }
        } else if name.ends_with(".sql") || name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Whether the line calls `now()` as a function of its own (not `compute_now()`, `Instant::now()` or `.now()`).
fn has_bare_now(line: &str) -> bool {
    let call = ["now", "()"].concat();
    line.match_indices(&call).any(|(at, _)| {
        !line[..at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':'))
    })
}

fn offences(root: &Path) -> Vec<String> {
    let mut all = Vec::new();
    files(root, &mut all);
    let mut found = Vec::new();
    for path in all {
        let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
        if relative.starts_with("migrations/core/0001_") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        for (number, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("//") || trimmed.starts_with("--") {
                continue;
            }
            let lower = line.to_ascii_lowercase();
            if has_bare_now(&lower) || forbidden().iter().any(|word| lower.contains(word.as_str())) {
                found.push(format!("{relative}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn no_sql_reads_the_clock_except_through_compute_now() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = offences(&root);
    assert!(found.is_empty(), "time in SQL comes from compute_now():\n{}", found.join("\n"));
}

#[test]
fn the_check_catches_each_spelling() {
    let now = ["now", "()"].concat();
    assert!(has_bare_now(&format!("select {now}")));
    assert!(has_bare_now(&format!("default {now},")));
    assert!(has_bare_now(&format!("({now})")));
    assert!(!has_bare_now(&format!("compute_{now}")));
    assert!(!has_bare_now(&format!("instant::{now}")));
    assert!(!has_bare_now(&format!("clock.{now}")));
    let dir = std::env::temp_dir().join(format!("bc-sql-now-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("migrations/core")).expect("dir");
    std::fs::write(dir.join("migrations/core/0001_clock.sql"), format!("select {now};")).expect("write");
    std::fs::write(dir.join("a.sql"), format!("insert into t values ({now});\n-- {now} in a comment\n"))
        .expect("write");
    std::fs::write(dir.join("b.rs"), format!("const Q: &str = \"SELECT {}\";\n", forbidden()[0].to_uppercase()))
        .expect("write");
    let found = offences(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("a.sql:1") || found[1].starts_with("a.sql:1"), "{found:?}");
}
