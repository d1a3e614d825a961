//! The CPU a server process spent on each statement it was sent, from PostgreSQL's `log_statement_stats`: for each
//! top-level statement (or simple-query message) the backend logs what `getrusage` counted while it ran, its own
//! CPU only. pg_stat_statements times a statement from start to end, waiting for a core included, so under load it
//! ranks statements but does not price them; this prices them.
//!
//! [`StatementCpu::start`] turns the setting on for the whole cluster (`ALTER SYSTEM`, then a reload, which every
//! backend applies before its next statement) and notes where the server's log ends; [`StatementCpu::finish`] turns
//! it off again and reads what was logged in between.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use bc_eventstore::cluster::Cluster;

/// A window of the server's log during which every statement's CPU was logged.
pub(crate) struct StatementCpu {
    log: PathBuf,
    from: u64,
}

/// What the statements of one shape cost over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Shape {
    pub calls: u64,
    /// Seconds of the backend's CPU (user and system).
    pub cpu: f64,
    /// Seconds from start to end.
    pub elapsed: f64,
}

/// `ALTER SYSTEM` runs outside a transaction: on a connection of its own, as the cluster's superuser. Returns once a
/// new connection sees the value: the postmaster has read it, and every backend applies it before its next
/// statement.
async fn set_logging(cluster: &Cluster, on: bool) -> anyhow::Result<()> {
    use sqlx::{ConnectOptions as _, Connection as _};
    let value = if on { "on" } else { "off" };
    let mut conn = cluster.connect_options("postgres").connect().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET log_statement_stats = {value}")))
        .execute(&mut conn)
        .await?;
    sqlx::raw_sql("SELECT pg_reload_conf()").execute(&mut conn).await?;
    conn.close().await.ok();
    for _ in 0..500 {
        let mut conn = cluster.connect_options("postgres").connect().await?;
        let seen: String =
            sqlx::query_scalar("SHOW log_statement_stats").persistent(false).fetch_one(&mut conn).await?;
        conn.close().await.ok();
        if seen == value {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    anyhow::bail!("the server did not take log_statement_stats = {value} within 5 s")
}

impl StatementCpu {
    /// Turns the logging on.
    pub(crate) async fn start(cluster: &Cluster) -> anyhow::Result<Self> {
        set_logging(cluster, true).await?;
        let log = cluster.log_file();
        let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        Ok(Self { log, from })
    }

    /// Turns the logging off and returns the cost of each statement shape logged since [`StatementCpu::start`].
    pub(crate) async fn finish(self, cluster: &Cluster) -> anyhow::Result<BTreeMap<String, Shape>> {
        let mut file = std::fs::File::open(&self.log)?;
        let to = file.metadata()?.len();
        set_logging(cluster, false).await?;
        file.seek(SeekFrom::Start(self.from))?;
        let mut bytes = Vec::new();
        file.take(to.saturating_sub(self.from)).read_to_end(&mut bytes)?;
        Ok(shapes(&String::from_utf8_lossy(&bytes)))
    }
}

/// The statements of a stretch of server log (default `log_line_prefix`, `%m [%p] `) grouped by [`shape`].
pub(crate) fn shapes(log: &str) -> BTreeMap<String, Shape> {
    // The usage last logged by each backend, waiting for the statement line that names it.
    let mut pending: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut waiting_usage: Option<&str> = None;
    let mut out: BTreeMap<String, Shape> = BTreeMap::new();
    for line in log.lines() {
        if let Some((pid, rest)) = backend_line(line) {
            if rest.starts_with("DETAIL:") {
                continue;
            }
            waiting_usage = None;
            if rest.starts_with("LOG:") && rest.contains("STATISTICS") {
                waiting_usage = Some(pid);
            } else if let Some(statement) = rest.strip_prefix("STATEMENT:")
                && let Some((cpu, elapsed)) = pending.remove(pid)
            {
                let entry = out.entry(shape(statement.trim())).or_default();
                entry.calls += 1;
                entry.cpu += cpu;
                entry.elapsed += elapsed;
            }
            continue;
        }
        if let (Some(pid), Some(usage)) = (waiting_usage, usage(line)) {
            pending.insert(pid, usage);
            waiting_usage = None;
        }
    }
    out
}

/// The backend's pid and the rest of a line that starts with `<date> <time> <zone> [<pid>] `.
fn backend_line(line: &str) -> Option<(&str, &str)> {
    let open = line.find(" [")?;
    if !line.as_bytes().first()?.is_ascii_digit() {
        return None;
    }
    let close = open + line[open..].find("] ")?;
    Some((&line[open + 2..close], &line[close + 2..]))
}

/// CPU (user plus system) and elapsed seconds from `! 0.000013 s user, 0.000016 s system, 0.000394 s elapsed`.
fn usage(line: &str) -> Option<(f64, f64)> {
    let text = line.trim_start().strip_prefix('!')?.trim();
    let mut numbers = text.split(", ").map(|part| part.split(' ').next().and_then(|n| n.parse::<f64>().ok()));
    let (user, system, elapsed) = (numbers.next()??, numbers.next()??, numbers.next()??);
    text.ends_with("elapsed").then_some((user + system, elapsed))
}

/// A statement's shape: its first keyword and the functions it calls in order, its literals left out, so that every
/// command's call of the same functions counts together (`SELECT append_events_or_refuse,inline_end,enqueue_work`).
pub(crate) fn shape(statement: &str) -> String {
    let mut text = String::with_capacity(statement.len());
    let mut chars = statement.chars().peekable();
    // Literals out: 'a''b', and E'\\x..' whose backslashes escape (in a plain literal a backslash is itself).
    let mut previous = ' ';
    while let Some(c) = chars.next() {
        if c == '\'' {
            let escapes = previous.eq_ignore_ascii_case(&'e');
            while let Some(inner) = chars.next() {
                if inner == '\\' && escapes {
                    chars.next();
                } else if inner == '\'' {
                    if chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        break;
                    }
                }
            }
            text.push('_');
        } else {
            text.push(c);
        }
        previous = c;
    }
    let head = text.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
    let head = match head.as_str() {
        "BEGIN" if text.contains("REPEATABLE READ") => "BEGIN (repeatable read)".to_owned(),
        "BEGIN" => "BEGIN (read committed)".to_owned(),
        other => other.to_owned(),
    };
    let mut functions: Vec<&str> = Vec::new();
    for (at, _) in text.match_indices('(') {
        let name_start = text[..at].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let name = &text[name_start..at];
        let skip = ["", "ARRAY", "set_config", "coalesce"];
        if !skip.contains(&name)
            && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && !functions.contains(&name)
        {
            functions.push(name);
        }
    }
    if functions.is_empty() { head } else { format!("{head} {}", functions.join(",")) }
}

#[cfg(test)]
mod tests {
    use super::{shape, shapes};

    #[test]
    fn a_statement_is_known_by_its_keyword_and_the_functions_it_calls_without_its_literals() {
        assert_eq!(
            shape(
                "SELECT append_events_or_refuse(E'rsv_x(y'::text, 2::int4)::text; SELECT inline_end(E'a''b'::text); COMMIT"
            ),
            "SELECT append_events_or_refuse,inline_end"
        );
        assert_eq!(
            shape(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE; SET LOCAL statement_timeout = 15000; SELECT reserve_facts(E'\\\\x(00'::text)"
            ),
            "BEGIN (repeatable read) reserve_facts"
        );
        assert_eq!(shape("SELECT f('C:\\', g(1))"), "SELECT f,g", "a plain literal's backslash escapes nothing");
        assert_eq!(shape("COMMIT"), "COMMIT");
    }

    #[test]
    fn each_statement_takes_the_usage_its_own_backend_logged_before_it() {
        let log = "\
2026-12-06 07:38:24.830 UTC [7295] LOG:  QUERY STATISTICS
2026-12-06 07:38:24.830 UTC [7295] DETAIL:  ! system usage stats:
\t!\t0.000034 s user, 0.000006 s system, 0.000655 s elapsed
\t!\t[0.242766 s user, 0.211386 s system total]
2026-12-06 07:38:24.830 UTC [7306] LOG:  QUERY STATISTICS
2026-12-06 07:38:24.830 UTC [7306] DETAIL:  ! system usage stats:
\t!\t0.000100 s user, 0.000000 s system, 0.000200 s elapsed
2026-12-06 07:38:24.831 UTC [7306] STATEMENT:  SELECT f(1)
2026-12-06 07:38:24.831 UTC [7295] STATEMENT:  SELECT f(2)
2026-12-06 07:38:24.832 UTC [7301] STATEMENT:  SELECT g(1)
";
        let shapes = shapes(log);
        let f = &shapes["SELECT f"];
        assert_eq!(f.calls, 2);
        assert!((f.cpu - 0.000140).abs() < 1e-9, "{f:?}");
        assert!((f.elapsed - 0.000855).abs() < 1e-9, "{f:?}");
        assert!(!shapes.contains_key("SELECT g"), "a statement with no usage logged before it counts nothing");
    }
}
