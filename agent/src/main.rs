//! `bcd`: the node agent. It will join the control plane, report the machine's inventory (GPUs through NVML,
//! or simulated ones), hold a liveness session and carry out commands; those arrive with the agent issue.
//! The agent links only `bc-domain`, never sqlx or axum.

mod simulate;

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
    /// Print the agent's version and the id prefix of the node it would register.
    Version,
    /// Print this machine's `NodeInventory v1` document as JSON, with each section's hash.
    Inventory {
        /// Simulated GPUs instead of NVML: `<count>x<model>`, such as `8xH100` or `4xA100-SXM4-80GB`.
        #[arg(long)]
        simulate: simulate::Simulated,
        /// The simulated machine's host name (its identifiers are derived from it).
        #[arg(long, default_value = "sim-0")]
        hostname: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => {
            println!("bcd {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Inventory { simulate, hostname } => {
            let document = simulate::inventory(&hostname, &simulate);
            let out = serde_json::json!({ "document": document, "hashes": document.hashes() });
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
    }
}
