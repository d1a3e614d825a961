//! `/metrics` as a Prometheus server and a Grafana dashboard read it: every family a real scrape declares follows
//! Prometheus's naming conventions, the fleet's figures (capacity, nodes by state, agents' sessions) follow what
//! happens to the fleet, and `docs/grafana/fleet.json` queries only families the scrape has, through its data
//! source variable.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bc_agent::simulate::{self, Simulated};
use bc_commands::nodes::NodeVerb;
use bc_commands::testing::{T0, request};
use bc_domain::agent::JoinRequest;
use bc_domain::device::DeviceClass;
use bc_domain::id::{NodeId, PoolId, ReservationId};
use bc_domain::inventory::SectionHashes;
use bc_domain::pool::Sharing;
use bc_eventstore::{clock, lease};
use bc_projections::testing::catch_up;
use serde_json::Value;

use crate::http_api::Api;
use crate::metrics::{sample, scrape};

/// The dashboard, from the repository's root.
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/grafana/fleet.json");

/// One sample line of an exposition: its name and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
}

/// One family, as its `# TYPE` and `# HELP` lines declare it, with the samples that belong to it.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: String,
    samples: Vec<Sample>,
}

/// An exposition read back: its families by name, and the samples no declared family owns.
#[derive(Debug, Default)]
struct Exposition {
    families: BTreeMap<String, Family>,
    strays: Vec<Sample>,
}

/// The suffixes a family's samples carry beyond its name, by type (OpenMetrics).
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_count", "_sum", "_created"],
        "summary" => &["", "_count", "_sum", "_created"],
        "info" => &["_info"],
        _ => &[""],
    }
}

/// Reads a sample line's name and labels (label values may hold `{`, `,` and escaped quotes).
fn parse_sample(line: &str) -> Sample {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = line[..end].to_owned();
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        while !rest.starts_with('}') {
            let eq = rest.find('=').unwrap_or_else(|| panic!("a label without a value in {line:?}"));
            let label = rest[..eq].to_owned();
            rest = rest[eq + 1..].strip_prefix('"').unwrap_or_else(|| panic!("an unquoted value in {line:?}"));
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let close = loop {
                match chars.next() {
                    Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| c)),
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("an unterminated value in {line:?}"),
                }
            };
            labels.push((label, value));
            rest = &rest[close + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    Sample { name, labels }
}

/// Reads an exposition: `# TYPE` and `# HELP` declare families, and each sample goes to the declared family whose
/// name and type's suffix make its name.
fn parse_exposition(text: &str) -> Exposition {
    let mut exposition = Exposition::default();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("a type");
            exposition.families.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            exposition.families.entry(name.to_owned()).or_default().help = help.to_owned();
        } else if !line.starts_with('#') && !line.is_empty() {
            samples.push(parse_sample(line));
        }
    }
    for sample in samples {
        let owner = exposition.families.iter_mut().find(|(name, family)| {
            suffixes(&family.kind).iter().any(|suffix| sample.name == format!("{name}{suffix}"))
        });
        match owner {
            Some((_, family)) => family.samples.push(sample),
            None => exposition.strays.push(sample),
        }
    }
    exposition
}

/// Units that are not base units: Prometheus names carry seconds and bytes.
const NOT_BASE_UNITS: [&str; 15] = [
    "ms",
    "millis",
    "milliseconds",
    "us",
    "micros",
    "microseconds",
    "ns",
    "nanoseconds",
    "minutes",
    "hours",
    "days",
    "kb",
    "kilobytes",
    "megabytes",
    "percent",
];

/// Words that make a figure a duration, whose name must then end in `_seconds`.
const DURATION_WORDS: [&str; 7] = ["age", "duration", "latency", "elapsed", "uptime", "delay", "timeout"];

/// Labels that would make a series per record: the fleet's figures are labelled by pool, never by these.
const RECORD_LABELS: [&str; 6] = ["id", "node", "node_id", "reservation", "reservation_id", "session_id"];

fn snake_case(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.contains("__")
        && !name.ends_with('_')
}

/// Every way the exposition's names break Prometheus's conventions, one line each.
fn convention_violations(exposition: &Exposition) -> Vec<String> {
    let mut found = Vec::new();
    for sample in &exposition.strays {
        found.push(format!("{}: a sample of no family declared with # TYPE", sample.name));
    }
    for (name, family) in &exposition.families {
        let mut say = |what: String| found.push(format!("{name}: {what}"));
        if !name.starts_with("bc_") {
            say("lacks the bc_ prefix".to_owned());
        }
        if !snake_case(name) {
            say("is not snake_case".to_owned());
        }
        if family.help.trim().is_empty() {
            say("has no help text".to_owned());
        }
        let words: Vec<&str> = name.split('_').collect();
        let last = words.last().copied().unwrap_or_default();
        for word in &words {
            if NOT_BASE_UNITS.contains(word) {
                say(format!("names the unit {word:?}: use seconds or bytes"));
            }
            if DURATION_WORDS.contains(word) && last != "seconds" {
                say(format!("is a duration ({word}) without _seconds at the end"));
            }
        }
        if words.contains(&"lag") && !["seconds", "events"].contains(&last) {
            say("is a lag without its unit (seconds or events) at the end".to_owned());
        }
        match family.kind.as_str() {
            "counter" if name.ends_with("_total") => {
                say("is a counter named with _total (the encoder adds it to the samples)".to_owned())
            }
            "gauge" => {
                for suffix in ["_total", "_count", "_sum", "_bucket", "_created", "_info"] {
                    if name.ends_with(suffix) {
                        say(format!("is a gauge ending in {suffix}"));
                    }
                }
            }
            "histogram" if !name.ends_with("_seconds") && !name.ends_with("_bytes") => {
                say("is a histogram without its base unit (_seconds, _bytes) at the end".to_owned())
            }
            "info" if name.ends_with("_info") => {
                say("is an info family named with _info (its sample adds it)".to_owned())
            }
            "counter" | "histogram" | "info" => {}
            other => say(format!("has the type {other:?}, which the service does not export")),
        }
        for sample in &family.samples {
            for (label, _) in &sample.labels {
                if !snake_case(label) {
                    found.push(format!("{}: the label {label:?} is not snake_case", sample.name));
                }
                if label == "le" && !sample.name.ends_with("_bucket") {
                    found.push(format!("{}: only a histogram's buckets carry le", sample.name));
                }
                if RECORD_LABELS.contains(&label.as_str()) {
                    found.push(format!("{}: the label {label:?} makes a series per record", sample.name));
                }
            }
        }
    }
    found
}

/// What [`fleet_in_every_state`] made.
struct Scenario {
    cordoned: NodeId,
    running: ReservationId,
}

/// A fleet that has something in every family: `pool` with three nodes (one cordoned, one joined by an agent whose
/// session is live), a reservation running and one placed for later, the read models caught up, and the clock ten
/// seconds past the agent's join.
async fn fleet_in_every_state(api: &Api, pool: &PoolId) -> Scenario {
    let fleet = &api.fleet;
    fleet.node(pool, "a", 8, 0).await;
    let cordoned = fleet.node(pool, "b", 8, 0).await;
    fleet.app.node_verb(&fleet.owner, &cordoned, NodeVerb::Cordon, None).await.expect("cordon");
    let running = fleet.reserve(&fleet.owner, "now", request(pool, DeviceClass::Gpu, 2)).await.expect("reserve now");
    let mut later = request(pool, DeviceClass::Gpu, 1);
    later.start_ms = Some(T0 + 7_200_000);
    fleet.reserve(&fleet.owner, "later", later).await.expect("reserve later");
    fleet.worker().run_until_idle().await.expect("worker");
    let token = fleet.app.create_join_token(&fleet.owner, pool, 3600).await.expect("join token").value.token;
    let spec: Simulated = "2xH100".parse().expect("spec");
    fleet
        .app
        .join(JoinRequest {
            join_token: token,
            agent_version: "test".into(),
            inventory: simulate::inventory("sim-1", &spec).report(&SectionHashes::new()),
            csr: None,
            role: None,
        })
        .await
        .expect("join");
    catch_up(&fleet.t.db).await;
    // A lease of this process's, so the leases' family has its labels.
    lease::acquire(&fleet.t.db, "shard:0", lease::process_owner_id(), Duration::from_secs(3600))
        .await
        .expect("acquire")
        .expect("free");
    clock::set_sim_clock(&fleet.t.db, T0 + 10_000).await.expect("clock");
    Scenario { cordoned, running: running.reservation.id }
}

#[tokio::test]
async fn every_metric_family_follows_the_prometheus_naming_conventions() {
    let api = Api::new().await;
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    fleet_in_every_state(&api, &pool).await;
    api.call("GET", "/v1/healthz", None, &[], None).await;
    let exposition = parse_exposition(&scrape(&api).await);
    // The scrape has what the check is about: every type the service exports, labels, and the fleet's families.
    let kinds: BTreeSet<&str> = exposition.families.values().map(|f| f.kind.as_str()).collect();
    assert!(kinds.is_superset(&BTreeSet::from(["counter", "gauge", "histogram", "info"])), "{kinds:?}");
    assert!(exposition.families.len() >= 30, "{} families", exposition.families.len());
    for family in ["bc_pool_atoms", "bc_nodes", "bc_agent_sessions", "bc_http_request_duration_seconds"] {
        assert!(!exposition.families[family].samples.is_empty(), "{family} has samples");
    }
    let violations = convention_violations(&exposition);
    assert!(violations.is_empty(), "names that break the conventions:\n{}", violations.join("\n"));
}

#[test]
fn the_convention_check_refuses_each_kind_of_bad_name() {
    let bad = "\
# HELP bc_jobs_total Jobs.
# TYPE bc_jobs_total counter
bc_jobs_total_total 1
# HELP bc_queue_total Keys.
# TYPE bc_queue_total gauge
bc_queue_total 3
# HELP bc_request_latency_ms Latency.
# TYPE bc_request_latency_ms gauge
bc_request_latency_ms 3
# HELP bc_wait How long.
# TYPE bc_wait histogram
bc_wait_bucket{le=\"+Inf\"} 1
bc_wait_count 1
bc_wait_sum 1
# HELP bc_heartbeat_age Age.
# TYPE bc_heartbeat_age gauge
bc_heartbeat_age 1
# HELP bc_projection_lag Lag.
# TYPE bc_projection_lag gauge
bc_projection_lag 1
# HELP bc_Nodes Nodes.
# TYPE bc_Nodes gauge
bc_Nodes{nodeState=\"up\"} 1
# HELP bc_slots Slots.
# TYPE bc_slots gauge
bc_slots{node_id=\"n1\"} 1
# HELP workers Workers.
# TYPE workers gauge
workers 1
# TYPE bc_build_info info
bc_build_info_info{version=\"1\"} 1
bc_orphan 1
# EOF
";
    let violations = convention_violations(&parse_exposition(bad));
    for expected in [
        "bc_jobs_total: is a counter named with _total",
        "bc_queue_total: is a gauge ending in _total",
        "bc_request_latency_ms: names the unit \"ms\"",
        "bc_request_latency_ms: is a duration (latency) without _seconds",
        "bc_wait: is a histogram without its base unit",
        "bc_heartbeat_age: is a duration (age) without _seconds",
        "bc_projection_lag: is a lag without its unit",
        "bc_Nodes: is not snake_case",
        "bc_Nodes: the label \"nodeState\" is not snake_case",
        "bc_slots: the label \"node_id\" makes a series per record",
        "workers: lacks the bc_ prefix",
        "bc_build_info: has no help text",
        "bc_build_info: is an info family named with _info",
        "bc_orphan: a sample of no family declared with # TYPE",
    ] {
        assert!(violations.iter().any(|v| v.starts_with(expected)), "{expected:?} not in {violations:#?}");
    }
    let good = "\
# HELP bc_jobs Jobs.
# TYPE bc_jobs counter
bc_jobs_total{pool=\"p1\"} 1
# HELP bc_wait_seconds How long.
# TYPE bc_wait_seconds histogram
bc_wait_seconds_bucket{le=\"+Inf\"} 1
bc_wait_seconds_count 1
bc_wait_seconds_sum 1
# HELP bc_build The release.
# TYPE bc_build info
bc_build_info{version=\"1\"} 1
# EOF
";
    assert_eq!(convention_violations(&parse_exposition(good)), Vec::<String>::new());
}

/// The atoms of resource `gpu` of `pool` in capacity family `family`.
fn gpus(text: &str, family: &str, pool: &PoolId) -> Option<f64> {
    sample(text, &format!(r#"bc_{family}{{pool="{pool}",resource="gpu"}}"#))
}

/// The nodes of `pool` in one combination of states.
fn nodes(text: &str, pool: &PoolId, connectivity: &str, provision_state: &str, schedulable: bool) -> Option<f64> {
    sample(
        text,
        &format!(
            r#"bc_nodes{{pool="{pool}",connectivity="{connectivity}",provision_state="{provision_state}",schedulable="{schedulable}"}}"#
        ),
    )
}

#[tokio::test]
async fn the_fleet_figures_count_the_pools_atoms_nodes_and_agents_sessions_as_they_change() {
    let api = Api::new().await;
    let fleet = &api.fleet;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let text = scrape(&api).await;
    assert_eq!(gpus(&text, "pool_atoms", &pool), None, "a pool without nodes has no capacity rows");
    assert!(text.contains("# TYPE bc_pool_atoms gauge"), "the family is declared without samples");

    let scenario = fleet_in_every_state(&api, &pool).await;
    let text = scrape(&api).await;
    // Three nodes: a (8 GPUs), b (8, cordoned) and the joined sim-1 (2, not schedulable before its agent reports
    // the spec it applied): only a's GPUs are allocatable.
    assert_eq!(gpus(&text, "pool_atoms", &pool), Some(18.0));
    assert_eq!(gpus(&text, "pool_allocatable_atoms", &pool), Some(8.0));
    // The reservation that started holds 2 GPUs; the one placed for later reserves 1.
    assert_eq!(gpus(&text, "pool_allocated_atoms", &pool), Some(2.0));
    assert_eq!(gpus(&text, "pool_reserved_atoms", &pool), Some(1.0));
    assert_eq!(gpus(&text, "pool_available_atoms", &pool), Some(6.0));
    assert_eq!(nodes(&text, &pool, "connected", "adopted", true), Some(1.0));
    assert_eq!(nodes(&text, &pool, "connected", "adopted", false), Some(2.0), "the cordoned node and the joined one");
    assert_eq!(sample(&text, &format!(r#"bc_agent_sessions{{pool="{pool}",state="live"}}"#)), Some(1.0));
    assert_eq!(sample(&text, &format!(r#"bc_agent_sessions{{pool="{pool}",state="expired"}}"#)), Some(0.0));
    // The agent's only heartbeat was its join, ten seconds ago.
    let oldest = format!(r#"bc_agent_heartbeat_oldest_age_seconds{{pool="{pool}"}}"#);
    assert_eq!(sample(&text, &oldest), Some(10.0));

    // The agent falls silent past its lease and the sweep disconnects its node; the running reservation is
    // released and the cordoned node taken back.
    fleet.advance_to(T0 + 120_000).await;
    fleet.app.release_reservation(&fleet.owner, &scenario.running).await.expect("release");
    fleet.app.node_verb(&fleet.owner, &scenario.cordoned, NodeVerb::Uncordon, None).await.expect("uncordon");
    fleet.worker().sweep_liveness().await.expect("sweep");
    fleet.worker().run_until_idle().await.expect("worker");
    catch_up(&fleet.t.db).await;
    let text = scrape(&api).await;
    assert_eq!(sample(&text, &format!(r#"bc_agent_sessions{{pool="{pool}",state="live"}}"#)), Some(0.0));
    assert_eq!(sample(&text, &format!(r#"bc_agent_sessions{{pool="{pool}",state="expired"}}"#)), Some(1.0));
    assert_eq!(sample(&text, &oldest), Some(0.0), "no live session");
    assert_eq!(nodes(&text, &pool, "connected", "adopted", true), Some(2.0), "{text}");
    assert_eq!(nodes(&text, &pool, "connected", "adopted", false), None, "{text}");
    // Two minutes of silence, more than twice the 40 s lease.
    assert_eq!(nodes(&text, &pool, "unreachable", "adopted", false), Some(1.0), "the silent agent's node");
    assert_eq!(gpus(&text, "pool_atoms", &pool), Some(18.0));
    assert_eq!(gpus(&text, "pool_allocatable_atoms", &pool), Some(16.0));
    assert_eq!(gpus(&text, "pool_allocated_atoms", &pool), Some(0.0));
}

/// A metric a query reads, with the label names its selector matches on.
type Read = (String, Vec<String>);

/// The metric names a PromQL expression reads, each with the label names its selector matches on. Function and
/// aggregation names, keywords, label names (in a selector, in `by (...)` and the like), strings, numbers,
/// durations, ranges and Grafana's variables are not metric names.
fn promql_metrics(expr: &str) -> Vec<Read> {
    // Aggregations can be written before their `by (...)`, so they are keywords, not only functions.
    const KEYWORDS: &str = "by without on ignoring group_left group_right offset bool and or unless sum min max avg \
                            group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio inf nan \
                            atan2";
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let chars: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut found: Vec<Read> = Vec::new();
    let mut previous_word = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '$' {
            // A Grafana variable: `$name`, `${name}` or `${name:format}`.
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
            }
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            // A selector's matchers: label names, and `__name__` naming the metric itself.
            let (end, labels, named) = selector(&chars, i);
            match (named, found.last_mut()) {
                (Some(name), _) => found.push((name, labels)),
                (None, Some(last)) if previous_word == last.0 => last.1.extend(labels),
                (None, _) => {}
            }
            previous_word.clear();
            i = end;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number or a duration (`0.99`, `1e3`, `5m`).
            while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            if LABEL_LISTS.contains(&word.as_str()) && chars.get(next) == Some(&'(') {
                while next < chars.len() && chars[next] != ')' {
                    next += 1;
                }
                i = next + 1;
            } else if word == "offset" {
                // Its duration follows.
                while next < chars.len() && (ident(chars[next]) || chars[next] == '-') {
                    next += 1;
                }
                i = next;
            } else if chars.get(next) != Some(&'(') && !KEYWORDS.split_whitespace().any(|k| k == word) {
                found.push((word.clone(), Vec::new()));
            }
            previous_word = word;
        } else {
            if !c.is_whitespace() {
                previous_word.clear();
            }
            i += 1;
        }
    }
    found
}

/// The index just past the string literal that starts at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        i += if chars[i] == '\\' && quote != '`' { 2 } else { 1 };
    }
    i + 1
}

/// Reads the selector that starts at `start` (`{`): the index past it, its label names, and the metric its
/// `__name__="..."` matcher names.
fn selector(chars: &[char], start: usize) -> (usize, Vec<String>, Option<String>) {
    let (mut labels, mut named) = (Vec::new(), None);
    let mut i = start + 1;
    loop {
        while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
            i += 1;
        }
        if i >= chars.len() || chars[i] == '}' {
            return (i + 1, labels, named);
        }
        let label_start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        let label: String = chars[label_start..i].iter().collect();
        while i < chars.len() && !['"', '\'', '`'].contains(&chars[i]) {
            i += 1;
        }
        let end = skip_string(chars, i);
        let value: String = chars[(i + 1).min(end)..end.saturating_sub(1).max(i + 1)].iter().collect();
        if label == "__name__" {
            named = Some(value);
        } else {
            labels.push(label);
        }
        i = end;
    }
}

/// The metric names a Grafana variable's query reads: `label_values(selector, label)` names a label after its
/// selector; anything else is PromQL.
fn variable_metrics(query: &str) -> Vec<Read> {
    let query = query.trim();
    match query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')) {
        Some(inner) => match inner.rsplit_once(',') {
            Some((selector, _label)) => promql_metrics(selector),
            None => Vec::new(),
        },
        None => promql_metrics(query),
    }
}

#[test]
fn promql_metric_names_are_read_past_functions_labels_keywords_and_variables() {
    let names = |expr: &str| promql_metrics(expr);
    let expr = r#"histogram_quantile(0.99, sum by (le, method, route) (rate(bc_http_request_duration_seconds_bucket{route=~"$route", method!="GET"}[$__rate_interval])))"#;
    assert_eq!(
        names(expr),
        vec![("bc_http_request_duration_seconds_bucket".to_owned(), vec!["route".to_owned(), "method".to_owned()])]
    );
    let expr = r#"sum without (instance) (bc_a_total offset 5m) / on (pool) group_left (name) bc_b{pool="x,{y}"} > bool 0.5e3 or vector(0) and bc_c @ start()"#;
    assert_eq!(
        names(expr),
        vec![
            ("bc_a_total".to_owned(), vec![]),
            ("bc_b".to_owned(), vec!["pool".to_owned()]),
            ("bc_c".to_owned(), vec![])
        ]
    );
    assert_eq!(
        names(r#"{__name__="bc_d", pool=~"${pool:regex}"}"#),
        vec![("bc_d".to_owned(), vec!["pool".to_owned()])]
    );
    assert_eq!(
        names("max(bc_e[5m:30s]) - min by (pool)(bc_f)"),
        vec![("bc_e".to_owned(), vec![]), ("bc_f".to_owned(), vec![])]
    );
    assert_eq!(
        variable_metrics(r#"label_values(bc_pool_atoms{pool=~"$pool"}, resource)"#),
        vec![("bc_pool_atoms".to_owned(), vec!["pool".to_owned()])]
    );
    assert_eq!(variable_metrics("label_values(pool)"), vec![]);
}

/// Every PromQL query of the dashboard, where it is: each panel's targets (rows' nested panels too) and each
/// query variable.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, Vec<Read>)> {
    fn panels(list: &Value, out: &mut Vec<(String, Vec<Read>)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_else(|| panic!("{title}: a target without expr"));
                out.push((format!("panel {title:?}: {expr}"), promql_metrics(expr)));
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).expect("a variable's query");
        out.push((format!("variable {}: {query}", variable["name"]), variable_metrics(query)));
    }
    out
}

/// Every place the dashboard names a data source that is not the `${datasource}` variable.
fn fixed_datasources(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let here = format!("{path}.{key}");
                if key == "datasource" {
                    let uid = inner.get("uid").unwrap_or(inner);
                    if !matches!(uid.as_str(), Some("${datasource}" | "$datasource")) {
                        out.push(format!("{here} = {inner}"));
                    }
                }
                fixed_datasources(inner, &here, out);
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                fixed_datasources(inner, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn the_fleet_dashboard_queries_only_families_a_real_scrape_has_through_its_datasource_variable() {
    let text = std::fs::read_to_string(DASHBOARD).expect("docs/grafana/fleet.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "a current Grafana schema");
    let variables = dashboard["templating"]["list"].as_array().expect("variables");
    let datasource = variables.iter().find(|v| v["name"] == "datasource").expect("a datasource variable");
    assert_eq!((&datasource["type"], &datasource["query"]), (&Value::from("datasource"), &Value::from("prometheus")));
    let pool = variables.iter().find(|v| v["name"] == "pool").expect("a pool variable");
    assert!(pool["query"]["query"].as_str().is_some_and(|q| q.starts_with("label_values(")), "{pool}");
    let mut fixed = Vec::new();
    fixed_datasources(&dashboard, "$", &mut fixed);
    assert!(fixed.is_empty(), "data sources not taken from ${{datasource}}:\n{}", fixed.join("\n"));

    let api = Api::new().await;
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    fleet_in_every_state(&api, &pool).await;
    api.call("GET", "/v1/healthz", None, &[], None).await;
    let exposition = parse_exposition(&scrape(&api).await);
    // What each sample name a query may read belongs to: a family, with the labels its samples carry.
    let mut readable: BTreeMap<String, (&str, BTreeSet<&str>)> = BTreeMap::new();
    for (family, declared) in &exposition.families {
        let labels: BTreeSet<&str> =
            declared.samples.iter().flat_map(|s| s.labels.iter().map(|(label, _)| label.as_str())).collect();
        for suffix in suffixes(&declared.kind) {
            readable.insert(format!("{family}{suffix}"), (family.as_str(), labels.clone()));
        }
    }
    let queries = dashboard_queries(&dashboard);
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for (place, metrics) in &queries {
        if metrics.is_empty() {
            missing.push(format!("{place}: reads no metric"));
        }
        for (metric, labels) in metrics {
            let Some((family, known)) = readable.get(metric) else {
                missing.push(format!("{place}: {metric} is in no family of the scrape"));
                continue;
            };
            used.insert(*family);
            for label in labels.iter().filter(|l| !known.contains(l.as_str())) {
                missing.push(format!("{place}: {metric} has no label {label}"));
            }
        }
    }
    assert!(missing.is_empty(), "the dashboard asks for what the service does not export:\n{}", missing.join("\n"));
    // It covers the fleet: capacity, nodes, lag, the queue, heartbeats, requests and their latency, retries.
    for family in [
        "bc_pool_atoms",
        "bc_pool_allocated_atoms",
        "bc_pool_available_atoms",
        "bc_nodes",
        "bc_projection_lag_seconds",
        "bc_projection_lag_events",
        "bc_work_queue_depth",
        "bc_work_queue_oldest_due_seconds",
        "bc_agent_heartbeat_oldest_age_seconds",
        "bc_heartbeat_transactions",
        "bc_http_requests",
        "bc_http_request_duration_seconds",
        "bc_transaction_retries",
    ] {
        assert!(used.contains(family), "no panel reads {family}");
    }
}
