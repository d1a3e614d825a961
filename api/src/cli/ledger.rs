//! `ledger`: the GPU-hour ledger through the API, as two tables (the pools' hours, then the tenants'), CSV (the
//! API's own form) or JSON.

use std::io::Write;

use bc_client::LedgerQuery;
use bc_wire::ledger::LedgerDto;
use clap::{Args, ValueEnum};

use super::{Connection, output, parse_time};

/// How `ledger` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LedgerFormat {
    Table,
    Csv,
    Json,
}

/// `ledger`.
#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// Only this pool (`pool_...`).
    #[arg(long)]
    pub pool: Option<String>,
    /// The first hour (RFC 3339, such as 2026-12-24T08:00:00Z; rounded down to the hour); by default 24 hours
    /// before --to.
    #[arg(long, value_parser = parse_time)]
    pub from: Option<i64>,
    /// The end (RFC 3339; rounded up to the hour, at most 31 days after --from); by default the end of the current
    /// hour.
    #[arg(long, value_parser = parse_time)]
    pub to: Option<i64>,
    /// Output: table, csv or json.
    #[arg(short, long, default_value = "table")]
    pub output: LedgerFormat,
    #[command(flatten)]
    pub connection: Connection,
}

/// `ledger`.
pub async fn ledger(args: LedgerArgs) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let query = LedgerQuery { pool: args.pool.clone(), from_ms: args.from, to_ms: args.to };
    let ledger = client.ledger(&query).await?;
    let mut out = std::io::stdout().lock();
    print(&ledger, args.output, &mut out)?;
    out.flush()?;
    Ok(())
}

/// Prints the ledger in `format`.
pub fn print(ledger: &LedgerDto, format: LedgerFormat, out: &mut dyn Write) -> anyhow::Result<()> {
    match format {
        LedgerFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(ledger)?)?,
        LedgerFormat::Csv => write!(out, "{}", ledger.to_csv())?,
        LedgerFormat::Table => {
            writeln!(out, "GPU-hours from {} to {}", output::time(ledger.from), output::time(ledger.to))?;
            writeln!(out)?;
            let mut pools = vec![row(["POOL", "HOUR", "CAPACITY", "BOOKED", "FREE"])];
            for p in &ledger.pools {
                let (capacity, booked, free) = (figure(p.capacity), figure(p.booked), figure(p.free));
                pools.push(vec![p.pool_id.clone(), output::time(p.hour), capacity, booked, free]);
            }
            aligned(&pools, out)?;
            writeln!(out)?;
            let mut tenants = vec![row(["POOL", "TENANT", "HOUR", "BOOKED", "BOUND", "IDLE", "UTILIZATION"])];
            for t in &ledger.tenants {
                let utilization = t.utilization.map_or_else(|| "-".to_owned(), |u| format!("{u:.1}%"));
                tenants.push(vec![
                    t.pool_id.clone(),
                    t.tenant_id.clone(),
                    output::time(t.hour),
                    figure(t.booked),
                    figure(t.bound),
                    figure(t.idle),
                    utilization,
                ]);
            }
            aligned(&tenants, out)?;
        }
    }
    Ok(())
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|cell| (*cell).to_owned()).collect()
}

/// Atom-hours to three decimals (3.6 seconds).
fn figure(hours: f64) -> String {
    format!("{hours:.3}")
}

/// Rows in columns as wide as their widest cell.
fn aligned(rows: &[Vec<String>], out: &mut dyn Write) -> anyhow::Result<()> {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for r in rows {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        writeln!(out, "{}", cells.join("   ").trim_end())?;
    }
    Ok(())
}
