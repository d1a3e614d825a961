//! Boundaries checked on the source: the HTTP layer reaches the database only through the write side's door, and no
//! module of the workspace imports one that imports it back.

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

/// Where the write side's crate may run SQL: its repository (`store`), the read models' queries (`reads`),
/// authorization's resolution of resources (`auth/resolve.rs`), and the test fixture.
const SQL_HOMES: [&str; 4] = ["store/", "reads.rs", "auth/resolve.rs", "testing.rs"];

#[test]
fn the_write_side_runs_sql_only_in_its_repository_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../commands/src");
    let mut files = Vec::new();
    collect(&src, &mut files);
    let mut homes_with_sql = 0;
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&file).expect("read a module");
        let runs_sql = ["sql::query", "sqlx::query", "raw_sql("].iter().any(|word| text.contains(word));
        if SQL_HOMES.iter().any(|home| relative.starts_with(home)) {
            homes_with_sql += usize::from(runs_sql);
        } else {
            assert!(!runs_sql, "commands/src/{relative} runs SQL: queries belong in commands/src/store");
        }
    }
    assert!(homes_with_sql >= 5, "only {homes_with_sql} modules with SQL found under {}", src.display());
}

/// The workspace's library crates, whose module graphs must have no circle.
const CRATES: [&str; 8] = ["domain", "eventstore", "projections", "commands", "api", "agent", "bench", "replay-tests"];

#[test]
fn no_module_of_the_workspace_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (mut modules, mut edges) = (0, 0);
    for krate in CRATES {
        let graph = ModuleGraph::read(&root.join(krate).join("src"));
        modules += graph.modules.len();
        edges += graph.edges.len();
        if let Some(circle) = graph.circle() {
            panic!("{krate}: the modules {} import each other in a circle", circle.join(" -> "));
        }
    }
    eprintln!("{modules} modules, {edges} references between them");
    assert!(modules >= 100, "only {modules} modules found under {}", root.display());
    assert!(edges >= 300, "only {edges} references between modules found: the reader misses them");
}

#[test]
fn the_circle_finder_finds_a_circle_through_sibling_modules() {
    let dir = std::env::temp_dir().join(format!("bc-tidy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (file, text) in [
        ("lib.rs", "mod http;\nmod wire;\n"),
        ("http/mod.rs", "mod fleet;\npub struct ApiError;\npub use fleet::audit;\n"),
        ("http/fleet.rs", "use crate::wire::{Page as Listed, other::Thing};\npub fn audit() {}\n"),
        ("wire/mod.rs", "mod reservations;\npub use reservations::Dto;\npub struct Page;\n"),
        ("wire/reservations.rs", "use super::super::http::ApiError;\npub struct Dto;\n"),
    ] {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create a folder");
        std::fs::write(path, text).expect("write a module");
    }
    let graph = ModuleGraph::read(&dir);
    let circle = graph.circle().expect("http and wire import each other");
    assert_eq!(circle, ["http", "wire", "http"]);
    std::fs::write(dir.join("wire/reservations.rs"), "pub struct Dto;\n").expect("write");
    assert_eq!(ModuleGraph::read(&dir).circle(), None, "a parent using its own children is no circle");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// The modules of one crate (paths from its root, `[]` for `lib.rs`) and which each refers to.
struct ModuleGraph {
    modules: Vec<Vec<String>>,
    edges: Vec<(Vec<String>, Vec<String>)>,
}

impl ModuleGraph {
    fn read(src: &Path) -> ModuleGraph {
        let mut files = Vec::new();
        collect(src, &mut files);
        let mut sources = Vec::new();
        for file in files {
            let relative = file.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            // Binaries are crates of their own; a `tests.rs` is a leaf of test code that may use anything.
            if parts.first().is_some_and(|p| p == "bin")
                || parts == ["main.rs"]
                || parts.last().is_some_and(|p| p == "tests.rs")
            {
                continue;
            }
            let last = parts.pop().expect("a file name");
            match last.as_str() {
                "lib.rs" | "mod.rs" => {}
                name => parts.push(name.trim_end_matches(".rs").to_owned()),
            }
            sources.push((parts, std::fs::read_to_string(&file).expect("read a module")));
        }
        let modules: Vec<Vec<String>> = sources.iter().map(|(m, _)| m.clone()).collect();
        let mut edges = Vec::new();
        for (module, text) in &sources {
            for path in paths(text) {
                if let Some(target) = resolve(&modules, module, &path)
                    && &target != module
                {
                    edges.push((module.clone(), target));
                }
            }
        }
        ModuleGraph { modules, edges }
    }

    /// A circle among the children of one module: an edge between two modules counts as an edge between the
    /// two children of their nearest common ancestor that hold them (a parent and its own children are not
    /// siblings, so a parent using its children and the children using it is no circle).
    fn circle(&self) -> Option<Vec<String>> {
        let mut lifted: Vec<(Vec<String>, String, String)> = Vec::new();
        for (from, to) in &self.edges {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue;
            }
            lifted.push((from[..common].to_vec(), from[common].clone(), to[common].clone()));
        }
        lifted.sort();
        lifted.dedup();
        for (parent, start, _) in &lifted {
            let next = |node: &String| -> Vec<String> {
                lifted.iter().filter(|(p, f, _)| p == parent && f == node).map(|(_, _, t)| t.clone()).collect()
            };
            let mut stack = vec![vec![start.clone()]];
            let mut seen = std::collections::BTreeSet::new();
            while let Some(trail) = stack.pop() {
                for to in next(trail.last().expect("a trail")) {
                    let mut longer = trail.clone();
                    longer.push(to.clone());
                    if &to == start {
                        let prefix = parent.iter().map(|p| format!("{p}::")).collect::<String>();
                        return Some(longer.iter().map(|m| format!("{prefix}{m}")).collect());
                    }
                    if seen.insert(to) {
                        stack.push(longer);
                    }
                }
            }
        }
        None
    }
}

fn collect(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// Every path of two or more segments in a module's code (comments left out), `use` trees expanded.
fn paths(text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].ends_with(':') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        if before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            rest = &rest[at + 4..];
            continue;
        }
        let tail = &rest[at + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        // A rename (`x as y`) becomes `x@y`; then the tree is read without whitespace.
        let tree = tail[..end].split_whitespace().collect::<Vec<_>>().join(" ").replace(" as ", "@");
        expand(&[], &tree.replace(' ', ""), &mut found);
        rest = &tail[end..];
    }
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_alphabetic() || chars[i] == '_' {
            // `$crate::` in a macro's body names the modules of wherever the macro is expanded, not this one's.
            let starts_word = i == 0 || !(chars[i - 1].is_alphanumeric() || "_:$".contains(chars[i - 1]));
            let mut segments = Vec::new();
            let mut j = i;
            loop {
                let begin = j;
                while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                segments.push(chars[begin..j].iter().collect::<String>());
                if j + 2 < chars.len()
                    && chars[j] == ':'
                    && chars[j + 1] == ':'
                    && (chars[j + 2].is_alphabetic() || chars[j + 2] == '_')
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if starts_word && segments.len() > 1 {
                found.push(segments);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
}

/// Expands one `use` tree (whitespace removed) under `prefix`.
fn expand(prefix: &[String], tree: &str, found: &mut Vec<Vec<String>>) {
    let tree = tree.trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let mut base = prefix.to_vec();
        base.extend(tree[..open].split("::").filter(|s| !s.is_empty()).map(str::to_owned));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut depth, mut start) = (0, 0);
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&base, &inner[start..k], found);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand(&base, &inner[start..], found);
    } else {
        let name = tree.split('@').next().unwrap_or(tree);
        let mut path = prefix.to_vec();
        path.extend(name.split("::").filter(|s| !s.is_empty()).map(str::to_owned));
        if path.len() > 1 {
            found.push(path);
        }
    }
}

/// The deepest module of the crate that `path`, written in `module`, names; `None` for another crate's.
fn resolve(modules: &[Vec<String>], module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut at: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            at = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            at = module.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            at = module.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                at.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            at = module.to_vec();
            at.push(first.to_owned());
            if !modules.contains(&at) {
                return None;
            }
            at.pop();
        }
        None => return None,
    }
    for segment in rest {
        at.push(segment.clone());
        if !modules.contains(&at) {
            at.pop();
            break;
        }
    }
    Some(at)
}
