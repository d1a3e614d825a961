//! What `get` and `describe` print: tables (`-o table|wide`), JSON, YAML and `kind/id` names, from the API's
//! own types.

use std::io::Write;

use anyhow::{Context as _, bail};
use bc_client::Client;
use bc_wire::fleet::PoolDto;
use bc_wire::reservations::ReservationDto;
use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value;

/// `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
    Name,
}

/// What `get` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    #[value(alias = "site")]
    Sites,
    #[value(alias = "pool")]
    Pools,
    #[value(alias = "node", alias = "no")]
    Nodes,
    #[value(alias = "reservation", alias = "res")]
    Reservations,
    #[value(alias = "instance", alias = "inst")]
    Instances,
    Audit,
}

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Sites => "sites",
            Kind::Pools => "pools",
            Kind::Nodes => "nodes",
            Kind::Reservations => "reservations",
            Kind::Instances => "instances",
            Kind::Audit => "audit",
        }
    }

    /// The singular, as `-o name` prints it (`node/node_...`).
    fn singular(self) -> &'static str {
        match self {
            Kind::Sites => "site",
            Kind::Pools => "pool",
            Kind::Nodes => "node",
            Kind::Reservations => "reservation",
            Kind::Instances => "instance",
            Kind::Audit => "audit",
        }
    }

    /// The event types whose streams are this kind's things, for `-w`.
    pub fn event_family(self) -> Option<&'static str> {
        match self {
            Kind::Sites => Some("site.*"),
            Kind::Pools => Some("pool.*"),
            Kind::Nodes => Some("node.*"),
            Kind::Reservations => Some("reservation.*"),
            Kind::Instances => Some("instance.*"),
            Kind::Audit => None,
        }
    }

    /// The kind an id names, by its prefix.
    fn of_id(id: &str) -> Option<Kind> {
        let prefix = id.split_once('_').map(|(prefix, _)| prefix)?;
        match prefix {
            "site" => Some(Kind::Sites),
            "pool" => Some(Kind::Pools),
            "node" => Some(Kind::Nodes),
            "rsv" => Some(Kind::Reservations),
            "inst" => Some(Kind::Instances),
            _ => None,
        }
    }

    /// The table's columns: a header and a JSON pointer into the item (or a computed cell), and whether the
    /// column shows only with `-o wide`.
    fn columns(self) -> &'static [(&'static str, Cell, bool)] {
        use Cell::{Bool, Count, Field, Nodes, Time};
        match self {
            Kind::Sites => &[
                ("ID", Field("/id"), false),
                ("NAME", Field("/name"), false),
                ("KIND", Field("/kind"), false),
                ("REGION", Field("/iamRegion"), false),
                ("OWNER", Field("/ownerTenantId"), true),
                ("CREATED", Time("/createdAt"), true),
            ],
            Kind::Pools => &[
                ("ID", Field("/id"), false),
                ("NAME", Field("/name"), false),
                ("CLASS", Field("/class"), false),
                ("GPU", Field("/gpuModel"), false),
                ("SHARING", Field("/sharing"), false),
                ("NODES", Field("/nodeCount"), false),
                ("SITE", Field("/siteId"), true),
                ("AGENT", Field("/agent"), true),
                ("OWNER", Field("/ownerTenantId"), true),
            ],
            Kind::Nodes => &[
                ("ID", Field("/id"), false),
                ("NAME", Field("/name"), false),
                ("CONNECTIVITY", Field("/connectivity"), false),
                ("SCHEDULABLE", Bool("/schedulable"), false),
                ("PROVISION", Field("/provisionState"), false),
                ("POWER", Field("/power"), false),
                ("GPUS", Field("/gpuCount"), false),
                ("POOL", Field("/poolId"), true),
                ("CORDONED", Bool("/cordoned"), true),
                ("DRAINING", Bool("/draining"), true),
                ("MAINTENANCE", Bool("/maintenance"), true),
                ("CONDITIONS", Count("/conditions"), true),
                ("REASONS", Field("/noScheduleReasons"), true),
            ],
            Kind::Reservations => &[
                ("ID", Field("/id"), false),
                ("POOL", Field("/poolId"), false),
                ("STATE", Field("/state"), false),
                ("COUNT", Field("/count"), false),
                ("RESOURCE", Field("/resource"), false),
                ("START", Time("/start"), false),
                ("END", Time("/end"), false),
                ("NODES", Nodes, true),
                ("TENANT", Field("/tenantId"), true),
                ("IDENTITY", Field("/identity"), true),
                ("OUTCOME", Field("/outcome"), true),
            ],
            Kind::Instances => &[
                ("ID", Field("/id"), false),
                ("NAME", Field("/name"), false),
                ("STATE", Field("/state"), false),
                ("DESIRED", Field("/desiredState"), false),
                ("NODE", Field("/nodeId"), false),
                ("POOL", Field("/poolId"), true),
                ("FLAVOR", Field("/flavorId"), true),
                ("RESERVATION", Field("/reservationId"), true),
                ("MESSAGE", Field("/message"), true),
            ],
            Kind::Audit => &[
                ("POSITION", Field("/position"), false),
                ("EVENT", Field("/eventType"), false),
                ("STREAM", Field("/streamId"), false),
                ("DECISION", Field("/decision"), false),
                ("IDENTITY", Field("/identity"), false),
                ("RECORDED", Time("/recordedAt"), true),
                ("REASON", Field("/reason"), true),
                ("REQUEST", Field("/requestId"), true),
            ],
        }
    }
}

/// How a table cell is read from an item.
#[derive(Debug, Clone, Copy)]
enum Cell {
    Field(&'static str),
    Bool(&'static str),
    Time(&'static str),
    Count(&'static str),
    /// A reservation's nodes, from its allocations.
    Nodes,
}

impl Cell {
    fn text(self, item: &Value) -> String {
        let at = |pointer: &str| item.pointer(pointer).cloned().unwrap_or(Value::Null);
        match self {
            Cell::Field(pointer) => plain(&at(pointer)),
            Cell::Bool(pointer) => match at(pointer) {
                Value::Bool(true) => "yes".into(),
                Value::Bool(false) => "no".into(),
                other => plain(&other),
            },
            Cell::Time(pointer) => at(pointer).as_i64().map_or_else(|| "-".into(), time),
            Cell::Count(pointer) => at(pointer).as_array().map_or(0, Vec::len).to_string(),
            Cell::Nodes => {
                let nodes: Vec<String> = item["allocations"]
                    .as_array()
                    .map(|allocations| allocations.iter().map(|a| plain(&a["nodeId"])).collect())
                    .unwrap_or_default();
                if nodes.is_empty() { "-".into() } else { nodes.join(",") }
            }
        }
    }
}

/// A value as one cell: strings unquoted, lists joined, nothing as `-`.
fn plain(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) if text.is_empty() => "-".into(),
        Value::String(text) => text.clone(),
        Value::Array(items) if items.is_empty() => "-".into(),
        Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Epoch milliseconds as an RFC 3339 time (UTC, whole seconds).
pub fn time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => {
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
        }
        Err(_) => ms.to_string(),
    }
}

/// This machine's clock, in epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

/// The device class a pool books, as a reservation spells it.
pub fn pool_atom_class(pool: &PoolDto) -> &'static str {
    if pool.policy.tenant_root == Some(true) {
        return "node";
    }
    match pool.sharing.as_str() {
        "mig" => "gpu.mig",
        "timeslice" | "mps" => "gpu.slot",
        _ => "gpu",
    }
}

/// Things of one kind, ready to print.
#[derive(Debug)]
pub struct Rows {
    kind: Kind,
    items: Vec<Value>,
    /// One thing asked for by id: printed as itself by `-o json|yaml`, not as a list.
    single: bool,
}

fn values<T: Serialize>(items: &[T]) -> anyhow::Result<Vec<Value>> {
    items.iter().map(|item| serde_json::to_value(item).context("encode an item")).collect()
}

impl Rows {
    pub fn reservations(items: Vec<ReservationDto>) -> Self {
        let items = items.iter().filter_map(|item| serde_json::to_value(item).ok()).collect();
        Rows { kind: Kind::Reservations, items, single: true }
    }

    /// Prints the rows; `header` prints the table's header (a watch prints it once).
    pub fn print(&self, format: Format, header: bool, out: &mut dyn Write) -> anyhow::Result<()> {
        match format {
            Format::Json => {
                let value = self.document();
                writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
            }
            Format::Yaml => {
                let value = self.document();
                let text = yaml_serde::to_string(&value).context("encode as YAML")?;
                write!(out, "{text}")?;
                if !text.ends_with('\n') {
                    writeln!(out)?;
                }
                if !header {
                    writeln!(out, "---")?;
                }
            }
            Format::Name => {
                for item in &self.items {
                    let id = item.get("id").or_else(|| item.get("position")).map(plain).unwrap_or_default();
                    writeln!(out, "{}/{id}", self.kind.singular())?;
                }
            }
            Format::Table | Format::Wide => {
                let wide = format == Format::Wide;
                let columns: Vec<_> =
                    self.kind.columns().iter().filter(|(_, _, only_wide)| wide || !only_wide).collect();
                let mut table: Vec<Vec<String>> = Vec::new();
                if header {
                    table.push(columns.iter().map(|(name, _, _)| (*name).to_owned()).collect());
                }
                for item in &self.items {
                    table.push(columns.iter().map(|(_, cell, _)| cell.text(item)).collect());
                }
                if header && self.items.is_empty() {
                    writeln!(out, "No {} found.", self.kind.plural())?;
                    return Ok(());
                }
                let widths: Vec<usize> = (0..columns.len())
                    .map(|c| table.iter().map(|row| row[c].chars().count()).max().unwrap_or(0))
                    .collect();
                for row in &table {
                    let mut line = String::new();
                    for (c, text) in row.iter().enumerate() {
                        if c + 1 == row.len() {
                            line.push_str(text);
                        } else {
                            line.push_str(&format!("{text:<width$}   ", width = widths[c]));
                        }
                    }
                    writeln!(out, "{}", line.trim_end())?;
                }
            }
        }
        Ok(())
    }

    fn document(&self) -> Value {
        match (self.single, self.items.as_slice()) {
            (true, [one]) => one.clone(),
            _ => serde_json::json!({ "items": self.items }),
        }
    }
}

/// The things `get` lists: all of a kind, or one by id.
pub async fn fetch(client: &Client, kind: Kind, id: Option<&str>, pool: Option<&str>) -> anyhow::Result<Rows> {
    let single = id.is_some();
    let items = match (kind, id) {
        (Kind::Sites, None) => values(&client.sites().await?)?,
        (Kind::Pools, None) => values(&client.pools().await?)?,
        (Kind::Nodes, None) => values(&client.nodes(pool).await?)?,
        (Kind::Reservations, None) => values(&client.reservations().await?)?,
        (Kind::Instances, None) => values(&client.all::<bc_wire::instances::InstanceDto>("/v1/instances").await?)?,
        (Kind::Audit, None) => values(&client.audit().await?)?,
        (Kind::Audit, Some(_)) => bail!("the audit trail is listed whole: get audit, without an id"),
        (kind, Some(id)) => vec![one(client, kind, id, None).await?],
    };
    Ok(Rows { kind, items, single })
}

/// One thing by id, once the read models have passed `after` (when given).
async fn one(client: &Client, kind: Kind, id: &str, after: Option<&str>) -> anyhow::Result<Value> {
    let path = match kind {
        Kind::Sites => format!("/v1/sites/{}", bc_client::encode(id)),
        Kind::Pools => format!("/v1/pools/{}", bc_client::encode(id)),
        Kind::Nodes => format!("/v1/nodes/{}", bc_client::encode(id)),
        Kind::Reservations => format!("/v1/reservations/{}", bc_client::encode(id)),
        Kind::Instances => format!("/v1/instances/{}", bc_client::encode(id)),
        Kind::Audit => bail!("the audit trail has no items by id"),
    };
    let path = match after {
        Some(after) => format!("{path}?after={}", bc_client::encode(after)),
        None => path,
    };
    Ok(client.get::<Value>(&path).await?)
}

/// The thing an event of a watch changed, as a row; `None` when it is not one the watch shows (another
/// pool's node, a thing the caller may no longer see).
pub async fn fetch_one_after(
    client: &Client,
    kind: Kind,
    id: &str,
    position: &str,
    pool: Option<&str>,
) -> anyhow::Result<Option<Rows>> {
    match one(client, kind, id, Some(position)).await {
        Ok(item) => {
            if let Some(pool) = pool
                && item["poolId"].as_str() != Some(pool)
            {
                return Ok(None);
            }
            Ok(Some(Rows { kind, items: vec![item], single: true }))
        }
        Err(err) if matches!(err.downcast_ref::<bc_client::Error>(), Some(e) if e.status() == Some(404)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The `Why:` section of a reservation's `describe`: the decision's summary, the reads it made, the quota
/// arithmetic, and the passed-over nodes with their reasons.
fn explanation(text: &mut String, e: &bc_wire::explanations::ExplanationDto) {
    text.push_str(&format!("Why:            {}\n", e.summary));
    if !e.tiers.is_empty() {
        let tiers: Vec<String> = e
            .tiers
            .iter()
            .map(|t| format!("{} ({} fitting{})", t.tier, t.candidates, if t.fits { ", planned" } else { "" }))
            .collect();
        text.push_str(&format!("  Searched:     {}\n", tiers.join(" → ")));
    }
    if let Some(quota) = &e.quota {
        text.push_str(&format!("  Quota:        {}\n", quota.arithmetic));
    }
    if let Some(policy) = &e.policy {
        text.push_str(&format!("  Policy:       {policy}\n"));
    }
    if !e.excluded_by.is_empty() {
        let kinds: Vec<String> = e.excluded_by.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        text.push_str(&format!("  Passed over:  {}\n", kinds.join(", ")));
    }
    for node in &e.excluded {
        text.push_str(&format!("    {}  {}\n", node.node_id, node.reason));
    }
}

/// `describe <id>`: the thing's fields, its conditions (nodes) or allocations (reservations), and its events.
pub async fn describe(client: &Client, id: &str) -> anyhow::Result<String> {
    let Some(kind) = Kind::of_id(id) else {
        bail!("{id:?} is not an id describe knows (rsv_, node_, pool_, site_ or inst_)");
    };
    let item = one(client, kind, id, None).await?;
    let mut text = String::new();
    let line =
        |text: &mut String, key: &str, value: String| text.push_str(&format!("{:<16}{value}\n", format!("{key}:")));
    line(&mut text, "Kind", kind.singular().to_owned());
    for (header, cell, _) in kind.columns() {
        let name = header.chars().next().map(|c| c.to_string()).unwrap_or_default()
            + &header.chars().skip(1).collect::<String>().to_lowercase();
        line(&mut text, &name, cell.text(&item));
    }
    let mut through = None;
    match kind {
        Kind::Nodes => {
            text.push_str("Conditions:\n");
            match item["conditions"].as_array().filter(|c| !c.is_empty()) {
                Some(conditions) => {
                    for condition in conditions {
                        text.push_str(&format!(
                            "  {:<24}{}  (since {})\n",
                            plain(&condition["kind"]),
                            plain(&condition["message"]),
                            condition["since"].as_i64().map_or_else(|| "-".into(), time)
                        ));
                    }
                }
                None => text.push_str("  none\n"),
            }
            let reasons = plain(&item["noScheduleReasons"]);
            line(&mut text, "Not scheduling", reasons);
        }
        Kind::Reservations => {
            text.push_str("Allocations:\n");
            match item["allocations"].as_array().filter(|a| !a.is_empty()) {
                Some(allocations) => {
                    for allocation in allocations {
                        text.push_str(&format!(
                            "  {}  on {}: {}\n",
                            plain(&allocation["allocationId"]),
                            plain(&allocation["nodeId"]),
                            plain(&allocation["devices"])
                        ));
                    }
                }
                None => text.push_str("  none\n"),
            }
            through = item["version"].as_u64().and_then(|v| u32::try_from(v).ok());
            match client.explanation(id, None).await {
                Ok(explained) => explanation(&mut text, &explained.explanation),
                // Recorded before decisions were explained.
                Err(err) if err.status() == Some(404) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Kind::Instances => through = item["version"].as_u64().and_then(|v| u32::try_from(v).ok()),
        _ => {}
    }
    text.push_str("Events:\n");
    let events = super::history(client, id, through).await?;
    if events.is_empty() {
        text.push_str("  none\n");
    }
    for event in events {
        let who = event.metadata.get("identity").map(plain).unwrap_or_else(|| "-".into());
        text.push_str(&format!(
            "  {}  v{:<3} {:<32} by {who}\n",
            time(event.recorded_at),
            event.stream_version,
            event.event_type
        ));
    }
    Ok(text)
}
