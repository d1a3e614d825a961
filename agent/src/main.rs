//! `bcd`: the node agent. It will join the control plane, report the machine's inventory (GPUs through NVML,
//! or simulated ones), hold a liveness session and carry out commands; those arrive with the agent issue.
//! The agent links only `bc-domain`, never sqlx or axum.

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => {
            println!("bcd {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    }
}
