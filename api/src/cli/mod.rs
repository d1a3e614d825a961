//! The kubectl-style command line: `get`, `describe`, `reserve`, `cancel`, `release`, `cordon`, `uncordon`,
//! `drain`, `ledger`, `config` and `completion`. It talks to the API through [`bc_client`] (never to the database), with
//! the server, token and CA of a named context in the configuration file ([`config`]). Every failure prints one
//! line naming the problem and exits 1.

pub mod audit;
pub mod config;
pub mod fleet;
pub mod ledger;
mod output;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bc_client::Client;
use bc_client::sse::{Item, StreamQuery};
use bc_wire::quotes::QuoteBody;
use bc_wire::reservations::{DevicesDto, ReserveBody};
use clap::{Args, Subcommand, ValueEnum};

use self::config::{CliConfig, ServerEntry};
pub use self::output::Format;
use self::output::{Kind, Rows};

/// Which server to talk to, and as whom: a context of the configuration file, overridden by flags.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The configuration file (default `$BETTER_COMPUTE_CONFIG`, else `~/.config/better-compute/config.toml`).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// The configured server to use instead of the current one.
    #[arg(long, global = true, env = "BETTER_COMPUTE_CONTEXT")]
    pub context: Option<String>,
    /// The server's URL, instead of the context's.
    #[arg(long, global = true, env = "BETTER_COMPUTE_SERVER")]
    pub server: Option<String>,
    /// The bearer token, instead of the context's.
    #[arg(long, global = true, env = "BETTER_COMPUTE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA certificate (PEM file) to check an https:// server against, instead of the context's.
    #[arg(long, global = true)]
    pub ca: Option<PathBuf>,
}

impl Connection {
    fn config_path(&self) -> anyhow::Result<PathBuf> {
        match &self.config {
            Some(path) => Ok(path.clone()),
            None => config::default_path(),
        }
    }

    /// The client this connection describes.
    pub fn client(&self) -> anyhow::Result<Client> {
        let entry = match &self.server {
            Some(url) => ServerEntry { url: url.clone(), token: None, ca: None },
            None => {
                let path = self.config_path()?;
                let config = CliConfig::load(&path)?;
                config.server(self.context.as_deref())?.1.clone()
            }
        };
        let token = self.token.clone().or(entry.token);
        let ca_path = self.ca.clone().or(entry.ca);
        let ca = match &ca_path {
            Some(path) => {
                Some(std::fs::read_to_string(path).with_context(|| format!("cannot read the CA {}", path.display()))?)
            }
            None => None,
        };
        Ok(Client::new(&entry.url, token, ca.as_deref())?)
    }
}

/// `get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// What to list: sites, pools, nodes, reservations, instances, audit.
    pub kind: Kind,
    /// One of them, by id.
    pub id: Option<String>,
    /// Output: table, wide, json, yaml or name.
    #[arg(short, long, default_value = "table")]
    pub output: Format,
    /// Only the nodes of this pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Keep watching: print each change as it happens (through the event stream).
    #[arg(short, long)]
    pub watch: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// `describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// A reservation (`rsv_`), node (`node_`), pool (`pool_`) or site (`site_`) id.
    pub id: String,
    #[command(flatten)]
    pub connection: Connection,
}

/// `reserve`.
#[derive(Debug, Args)]
pub struct ReserveArgs {
    /// The pool (`pool_...`).
    #[arg(long)]
    pub pool: String,
    /// How many devices (GPUs, or the pool's atoms).
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// The device class: gpu, mig, slot or node (the pool's own atom when left out).
    #[arg(long)]
    pub class: Option<String>,
    /// How long: `3600`, `90m`, `8h`, `2days`.
    #[arg(long, value_parser = parse_duration)]
    pub duration: u64,
    /// When it starts (RFC 3339, such as 2026-12-24T08:00:00Z); as soon as it is placed when left out.
    #[arg(long, value_parser = parse_time)]
    pub start: Option<i64>,
    /// Refuse rather than wait in pending when it cannot be placed now.
    #[arg(long)]
    pub no_wait: bool,
    /// The project it is charged to.
    #[arg(long)]
    pub project: Option<String>,
    /// Spread the devices evenly over this many nodes (a gang); on one node when left out.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Makes a retried command answer the same reservation (a fresh one is made up when left out).
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Quote it and reserve nothing: the earliest start (not before --start), the exact devices per node, and the
    /// token that books them with --quote.
    #[arg(long, conflicts_with = "quote")]
    pub dry_run: bool,
    /// Book exactly what a dry run quoted (its token; the other flags as the dry run printed them), or fail
    /// naming what changed since. Never waits in pending.
    #[arg(long)]
    pub quote: Option<String>,
    #[arg(short, long, default_value = "table")]
    pub output: Format,
    #[command(flatten)]
    pub connection: Connection,
}

/// `cancel` and `release`.
#[derive(Debug, Args)]
pub struct ReservationVerb {
    /// The reservation (`rsv_...`).
    pub id: String,
    /// Why, for the audit trail.
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `cordon`, `uncordon` and `drain`.
#[derive(Debug, Args)]
pub struct NodeVerb {
    /// The node (`node_...`).
    pub id: String,
    /// Why, for the audit trail.
    #[arg(long)]
    pub reason: Option<String>,
    /// With drain: end what runs there now instead of letting it finish.
    #[arg(long)]
    pub force: bool,
    /// With drain: return at once instead of following it with a progress bar.
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// `config`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Add or change a server.
    SetServer {
        name: String,
        #[arg(long)]
        url: String,
        #[arg(long)]
        token: Option<String>,
        /// The CA certificate (PEM file) for an https:// URL.
        #[arg(long)]
        ca: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Make a server the current one.
    Use {
        name: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Show the servers (tokens hidden).
    View {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `fleet`.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Print the caller's sites, pools (policies, offers and quotas) and profiles as a YAML document.
    Export {
        #[command(flatten)]
        connection: Connection,
    },
    /// Say what `apply` would change to make the fleet as the document says.
    Plan(FleetArgs),
    /// Make the fleet as the document says (twice is a no-op).
    Apply(FleetArgs),
}

/// `fleet plan` and `fleet apply`.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// The document (YAML or JSON); `-` reads standard input.
    #[arg(short, long)]
    pub file: PathBuf,
    /// Also remove what the document does not name: offers, pools, sites.
    #[arg(long)]
    pub prune: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// `fleet`.
pub async fn fleet(command: FleetCommand) -> anyhow::Result<()> {
    let read = |args: &FleetArgs| -> anyhow::Result<fleet::FleetDocument> {
        let text = if args.file.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("read the document from standard input")?
        } else {
            std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?
        };
        fleet::FleetDocument::parse(&text)
    };
    match command {
        FleetCommand::Export { connection } => {
            print!("{}", fleet::export(&connection.client()?).await?);
        }
        FleetCommand::Plan(args) => {
            let document = read(&args)?;
            let plan = fleet::plan(&args.connection.client()?, &document, args.prune).await?;
            print!("{}", plan.text(args.prune));
        }
        FleetCommand::Apply(args) => {
            let document = read(&args)?;
            let client = args.connection.client()?;
            let plan = fleet::plan(&client, &document, args.prune).await?;
            if plan.is_empty() {
                print!("{}", plan.text(args.prune));
                return Ok(());
            }
            fleet::apply(&client, &plan).await?;
            println!("Applied.");
        }
    }
    Ok(())
}

/// A shell for `completion`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl From<Shell> for clap_complete::Shell {
    fn from(shell: Shell) -> Self {
        match shell {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        }
    }
}

/// Writes the completion script of `command` for `shell`.
pub fn completion(shell: Shell, command: &mut clap::Command, out: &mut dyn std::io::Write) {
    let name = command.get_name().to_owned();
    clap_complete::generate(clap_complete::Shell::from(shell), command, name, out);
}

/// `1h30m`, `90m`, `3600` (seconds) as whole seconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(seconds);
    }
    let duration = humantime::parse_duration(text).map_err(|err| format!("{text:?} is not a duration ({err})"))?;
    if duration.subsec_nanos() != 0 {
        return Err(format!("{text:?} is not a whole number of seconds"));
    }
    Ok(duration.as_secs())
}

/// An RFC 3339 time as epoch milliseconds.
pub fn parse_time(text: &str) -> Result<i64, String> {
    let time = humantime::parse_rfc3339_weak(text).map_err(|err| format!("{text:?} is not a time ({err})"))?;
    let since = time.duration_since(std::time::UNIX_EPOCH).map_err(|_| format!("{text:?} is before 1970"))?;
    i64::try_from(since.as_millis()).map_err(|_| format!("{text:?} is too far ahead"))
}

/// `get`. With `-w`, the event stream is opened first and the list read after it, so nothing that changes
/// between the two is missed; then each change prints its thing's new row.
pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let mut stream = match (args.watch, args.kind.event_family()) {
        (false, _) => None,
        (true, None) => bail!("{} cannot be watched", args.kind.plural()),
        (true, Some(family)) => {
            let query = StreamQuery { after: None, stream: args.id.clone(), types: Some(family.to_owned()) };
            Some(client.events(&query).await?)
        }
    };
    let rows = output::fetch(&client, args.kind, args.id.as_deref(), args.pool.as_deref()).await?;
    let mut out = std::io::stdout().lock();
    rows.print(args.output, true, &mut out)?;
    out.flush()?;
    drop(out);
    let Some(stream) = stream.as_mut() else { return Ok(()) };
    while let Some(item) = stream.next().await? {
        let Item::Event(event) = item else { continue };
        // The read models answer once they have passed the event's position.
        let changed =
            output::fetch_one_after(&client, args.kind, &event.stream_id, &event.position, args.pool.as_deref())
                .await?;
        if let Some(rows) = changed {
            let mut out = std::io::stdout().lock();
            rows.print(args.output, false, &mut out)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// Waits until the read model behind `path` shows the client's latest write (its reads send that position).
async fn settle(client: &Client, path: &str) -> anyhow::Result<()> {
    client.get::<serde_json::Value>(path).await?;
    Ok(())
}

/// `whoami`: who the context's token speaks for, on which server.
pub async fn whoami(connection: Connection) -> anyhow::Result<()> {
    let client = connection.client()?;
    let me = client.whoami().await?;
    println!("server:   {}", client.base());
    println!("tenant:   {}{}", me.tenant_id, if me.platform { " (the platform)" } else { "" });
    println!("identity: {} ({} session)", me.identity, me.session_kind);
    if !me.ancestors.is_empty() {
        println!("under:    {}", me.ancestors.join(" < "));
    }
    Ok(())
}

/// `describe`.
pub async fn describe(args: DescribeArgs) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let text = output::describe(&client, &args.id).await?;
    print!("{text}");
    Ok(())
}

/// `reserve`.
pub async fn reserve(args: ReserveArgs) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    // The pool's own atom unless the class is given: ask the pool what it books.
    let class = match &args.class {
        Some(class) => class.clone(),
        None => output::pool_atom_class(&client.pool(&args.pool).await?).to_owned(),
    };
    let topology = match args.nodes {
        Some(nodes) => serde_json::json!({ "kind": "gang", "nodes": nodes }),
        None => serde_json::json!({ "kind": "same-node" }),
    };
    let devices: DevicesDto =
        serde_json::from_value(serde_json::json!({ "class": class, "count": args.count, "topology": topology }))
            .context("the device request")?;
    if args.dry_run {
        return dry_run(&client, &args, devices).await;
    }
    let key = args.idempotency_key.clone().unwrap_or_else(|| ulid::Ulid::new().to_string());
    let mut body: ReserveBody = serde_json::from_value(serde_json::json!({
        "poolId": args.pool,
        "devices": devices,
        "duration": args.duration,
    }))
    .context("the reservation request")?;
    body.start = args.start;
    body.project_id = args.project.clone();
    // A quote's request never waits: it books the quoted devices or is refused.
    body.wait = (args.no_wait || args.quote.is_some()).then_some(false);
    body.quote = args.quote.clone();
    let made = client.reserve(&body, &key).await?;
    // Read back once the read models show it, so that the next command sees it too.
    let made = client.reservation(&made.id).await?;
    settle(&client, "/v1/reservations?limit=1").await?;
    let mut out = std::io::stdout().lock();
    Rows::reservations(vec![made]).print(args.output, true, &mut out)?;
    Ok(())
}

/// `reserve --dry-run`: the quote, and the command that books it.
async fn dry_run(client: &Client, args: &ReserveArgs, devices: DevicesDto) -> anyhow::Result<()> {
    let mut body: QuoteBody = serde_json::from_value(serde_json::json!({
        "devices": devices,
        "duration": args.duration,
    }))
    .context("the quote request")?;
    body.not_before = args.start;
    body.project_id = args.project.clone();
    let quote = match client.quote(&args.pool, &body).await {
        Ok(quote) => quote,
        Err(bc_client::Error::Api { code, message, .. })
            if code == "CAPACITY_UNAVAILABLE" || code == "QUOTA_EXCEEDED" =>
        {
            println!("{message}: nothing would be reserved");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    println!("earliest start: {} (dry run: nothing was reserved)", output::time(quote.start));
    println!("window: {} to {}", output::time(quote.start), output::time(quote.end));
    for allocation in &quote.allocations {
        println!("devices: {} on {}", allocation.devices.join(", "), allocation.node_id);
    }
    println!("quote: {} (book it before {})", quote.quote, output::time(quote.expires_at));
    let mut book = format!(
        "better-compute reserve --pool {} --count {} --class {} --duration {}",
        args.pool, args.count, quote.reserve.devices.class, args.duration
    );
    if let Some(nodes) = args.nodes {
        book.push_str(&format!(" --nodes {nodes}"));
    }
    match quote.reserve.start {
        Some(start) => book.push_str(&format!(" --start {}", output::time(start))),
        None => println!("(the window starts when it is booked)"),
    }
    if let Some(project) = &args.project {
        book.push_str(&format!(" --project {project}"));
    }
    println!("book it: {book} --quote {}", quote.quote);
    Ok(())
}

/// `cancel`.
pub async fn cancel(args: ReservationVerb) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let reservation = client.cancel(&args.id, args.reason).await?;
    let reservation = client.reservation(&reservation.id).await?;
    settle(&client, "/v1/reservations?limit=1").await?;
    println!("reservation/{} {}", reservation.id, reservation.state);
    Ok(())
}

/// `release`.
pub async fn release(args: ReservationVerb) -> anyhow::Result<()> {
    if args.reason.is_some() {
        bail!("release takes no --reason (cancel does)");
    }
    let client = args.connection.client()?;
    let reservation = client.release(&args.id).await?;
    let reservation = client.reservation(&reservation.id).await?;
    settle(&client, "/v1/reservations?limit=1").await?;
    println!("reservation/{} {}", reservation.id, reservation.state);
    Ok(())
}

/// `cordon`.
pub async fn cordon(args: NodeVerb) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let node = client.cordon(&args.id, args.reason).await?;
    let node = client.node(&node.id).await?;
    settle(&client, "/v1/nodes?limit=1").await?;
    println!("node/{} cordoned", node.id);
    Ok(())
}

/// `uncordon`.
pub async fn uncordon(args: NodeVerb) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let node = client.uncordon(&args.id, args.reason).await?;
    let node = client.node(&node.id).await?;
    settle(&client, "/v1/nodes?limit=1").await?;
    println!("node/{} uncordoned", node.id);
    Ok(())
}

/// `drain`: starts the drain, then follows it with a progress bar of the node's atoms still booked until the
/// node says it is drained.
pub async fn drain(args: NodeVerb) -> anyhow::Result<()> {
    let client = args.connection.client()?;
    let node = client.drain(&args.id, args.force, args.reason).await?;
    if args.no_wait {
        println!("node/{} draining", node.id);
        return Ok(());
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} draining {prefix} [{bar:30}] {pos}/{len} atoms free {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(node.id.clone());
    let mut backoff = Duration::from_millis(250);
    loop {
        let node = client.node(&args.id).await?;
        let now = output::now_ms();
        let free = client.free_atoms(&node.pool_id, now, now + 1000).await?;
        let free_here = free.iter().find(|n| n.node_id == node.id).map_or(0, |n| n.atoms.len() as u64);
        bar.set_length(u64::from(node.atom_count));
        bar.set_position(free_here.min(u64::from(node.atom_count)));
        if !node.draining {
            if node.cordoned {
                bar.finish_and_clear();
                println!("node/{} drained", node.id);
                return Ok(());
            }
            bar.abandon_with_message("uncordoned before it was drained");
            bail!("node {} was uncordoned before it was drained", node.id);
        }
        bar.tick();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// `config`.
pub fn config(command: ConfigCommand) -> anyhow::Result<()> {
    let path_of = |given: Option<PathBuf>| given.map_or_else(config::default_path, Ok);
    match command {
        ConfigCommand::SetServer { name, url, token, ca, config } => {
            let path = path_of(config)?;
            let mut file = CliConfig::load(&path)?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("--url {url:?} is not an http:// or https:// URL");
            }
            let ca = ca.map(|ca| std::path::absolute(&ca).unwrap_or(ca));
            file.servers.insert(name.clone(), ServerEntry { url, token, ca });
            if file.current.is_none() {
                file.current = Some(name.clone());
            }
            file.save(&path)?;
            println!("server {name} saved in {}", path.display());
        }
        ConfigCommand::Use { name, config } => {
            let path = path_of(config)?;
            let mut file = CliConfig::load(&path)?;
            file.server(Some(&name))?;
            file.current = Some(name.clone());
            file.save(&path)?;
            println!("using {name}");
        }
        ConfigCommand::View { config } => {
            let path = path_of(config)?;
            let file = CliConfig::load(&path)?;
            println!("# {}", path.display());
            for (name, entry) in &file.servers {
                let mark = if file.current.as_deref() == Some(name.as_str()) { "*" } else { " " };
                let token = if entry.token.is_some() { "token set" } else { "no token" };
                let ca = entry.ca.as_ref().map(|ca| format!(", CA {}", ca.display())).unwrap_or_default();
                println!("{mark} {name}\t{}\t({token}{ca})", entry.url);
            }
        }
    }
    Ok(())
}

/// Adds (or refreshes) the servers `dev` runs as contexts of the configuration file, so that the CLI works
/// at once: `dev` as the platform administrator, `dev-demo` as the demo customer. The current context is set
/// only when none is.
pub fn add_dev_contexts(url: &str, ca: Option<&std::path::Path>, root: &str, demo: &str) -> anyhow::Result<PathBuf> {
    let path = config::default_path()?;
    let mut file = CliConfig::load(&path)?;
    let ca = ca.map(|ca| std::path::absolute(ca).unwrap_or_else(|_| ca.to_path_buf()));
    for (name, token) in [("dev", root), ("dev-demo", demo)] {
        file.servers.insert(
            name.to_owned(),
            ServerEntry { url: url.to_owned(), token: Some(token.to_owned()), ca: ca.clone() },
        );
    }
    if file.current.is_none() {
        file.current = Some("dev".to_owned());
    }
    file.save(&path)?;
    Ok(path)
}

/// Follows the event stream of `stream` to print the events committed so far (for `describe`).
pub(crate) async fn history(
    client: &Client,
    stream: &str,
    through: Option<u32>,
) -> anyhow::Result<Vec<bc_wire::ops::EventDto>> {
    match through {
        Some(version) => Ok(client.stream_history(stream, version).await?),
        None => {
            // Without a version to stop at: what the stream replays before it goes quiet.
            let query = StreamQuery { stream: Some(stream.to_owned()), ..StreamQuery::from_start() };
            let mut events = Vec::new();
            let mut open = client.events(&query).await?;
            loop {
                match tokio::time::timeout(Duration::from_millis(500), open.next()).await {
                    Ok(Ok(Some(Item::Event(event)))) => events.push(*event),
                    Ok(Ok(Some(Item::Notice { .. }))) => {}
                    Ok(Ok(None)) | Err(_) => return Ok(events),
                    Ok(Err(err)) => return Err(err.into()),
                }
            }
        }
    }
}
