//! `bcd`: the node agent's command line.

use std::path::PathBuf;

use anyhow::Context as _;
use bc_agent::run::{AgentConfig, InventorySource, ServerTrust, run};
use bc_agent::simulate;
use clap::{Parser, Subcommand};

/// bcd: Better Compute's node agent.
#[derive(Debug, Parser)]
#[command(name = "bcd", version, about, long_about = None, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the agent's version.
    Version,
    /// Print this machine's `NodeInventory v1` document as JSON, with each section's hash.
    Inventory {
        /// Simulated GPUs instead of NVML: `<count>x<model>[:<MIG profile>*<n>,...]`, such as `8xH100`,
        /// `4xA100-SXM4-80GB` or `8xH100:1g.10gb*7`.
        #[arg(long)]
        simulate: Option<simulate::Simulated>,
        /// The host name to report (a simulated machine's identifiers are derived from it).
        #[arg(long)]
        hostname: Option<String>,
    },
    /// Join the control plane (once, with a join token) and run: heartbeats, inventory, commands.
    Run(RunArgs),
    /// Run as the site agent: join with role `site` and carry out the site's BMC steps of machines' workflows
    /// (one agent serves a site at a time; more wait as standbys).
    Site {
        #[command(flatten)]
        run: RunArgs,
        /// The CA (PEM) that signs the site's BMC certificates, for BMCs not enrolled with `insecureTls`.
        #[arg(long, env = "BCD_BMC_CA")]
        bmc_ca: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The control plane's base URL.
    #[arg(long, env = "BCD_SERVER", default_value = "https://127.0.0.1:8080")]
    server: String,
    /// The control plane's CA certificate (the `ca.crt` of its PKI bundle): the only CA this agent trusts.
    #[arg(long, env = "BCD_CA", required_unless_present = "insecure_http")]
    ca: Option<PathBuf>,
    /// Talk plain HTTP to an http:// server instead (join tokens and credentials cross in the clear).
    #[arg(long, conflicts_with = "ca")]
    insecure_http: bool,
    /// The join token (`jt_...`), needed only until the node has its credential.
    #[arg(long, env = "BCD_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// Where the node credential is kept.
    #[arg(long, env = "BCD_STATE_DIR", default_value = "/var/lib/bcd")]
    state_dir: PathBuf,
    /// Where CDI spec files for bound reservations are written.
    #[arg(long, env = "BCD_CDI_DIR", default_value = "/etc/cdi")]
    cdi_dir: PathBuf,
    /// Simulated GPUs instead of NVML: `<count>x<model>[:<MIG profile>*<n>,...]`, such as `8xH100:1g.10gb*7`.
    #[arg(long)]
    simulate: Option<simulate::Simulated>,
    /// The host name to report.
    #[arg(long)]
    hostname: Option<String>,
}

fn source(simulate: Option<simulate::Simulated>, hostname: Option<String>) -> InventorySource {
    match simulate {
        Some(spec) => {
            let host = hostname.unwrap_or_else(|| "sim-0".to_owned());
            InventorySource::simulated(simulate::inventory(&host, &spec)).0
        }
        None => InventorySource::Local { hostname },
    }
}

fn main() -> std::process::ExitCode {
    bc_pki::tls::install_default_provider();
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One line, never a backtrace.
            eprintln!("bcd: {}", format!("{err:#}").replace('\n', " "));
            std::process::ExitCode::FAILURE
        }
    }
}

fn start() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => {
            println!("bcd {}", bc_agent::VERSION);
            Ok(())
        }
        Command::Inventory { simulate, hostname } => {
            let document = source(simulate, hostname).read();
            let key = bc_domain::hardware::hardware_key(&document.hardware_identity());
            let out = serde_json::json!({ "document": document, "hashes": document.hashes(), "hardwareKey": key });
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        Command::Run(args) => run_agent(args, None),
        Command::Site { run, bmc_ca } => {
            let bmc_ca = bmc_ca
                .map(|path| {
                    std::fs::read_to_string(&path).with_context(|| format!("read the BMC CA {}", path.display()))
                })
                .transpose()?;
            run_agent(run, Some(bc_agent::site::SiteConfig { bmc_ca, bmc_timeout: None }))
        }
    }
}

fn run_agent(args: RunArgs, site: Option<bc_agent::site::SiteConfig>) -> anyhow::Result<()> {
    let RunArgs { server, ca, insecure_http, join_token, state_dir, cdi_dir, simulate, hostname } = args;
    let trust = match ca {
        Some(path) if !insecure_http => ServerTrust::PinnedCa(
            std::fs::read_to_string(&path).with_context(|| format!("read the CA certificate {}", path.display()))?,
        ),
        _ => ServerTrust::InsecureHttp,
    };
    let config = AgentConfig {
        server,
        trust,
        join_token,
        state_dir,
        cdi_dir,
        inventory: source(simulate, hostname),
        inventory_every: 60,
        site,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        run(config, stop).await
    })
}
