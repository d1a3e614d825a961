//! `bcx`: serve a built-in driver out of process, or run the conformance suite against any running driver.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "bcx", version, about = "Better Compute's drivers: serve one, or check one against the protocol")]
enum Cli {
    /// Serve the built-in `better-compute` provider driver over mutual TLS.
    Serve {
        /// Where to listen, such as 127.0.0.1:7443.
        #[arg(long, env = "BCX_LISTEN")]
        listen: String,
        #[command(flatten)]
        identity: IdentityArgs,
        /// The CA certificates (PEM) of the lending deployments this driver may call.
        #[arg(long, env = "BCX_TRUST")]
        trust: Option<PathBuf>,
    },
    /// Run the conformance suite against a running provider driver: acquires one machine of one GPU for the
    /// account, and gives it back.
    Conformance {
        /// The driver's URL, such as https://127.0.0.1:7443.
        #[arg(long)]
        driver: String,
        #[command(flatten)]
        identity: IdentityArgs,
        /// The account's endpoint at the provider.
        #[arg(long)]
        endpoint: String,
        /// The account's settings, `key=value`, repeated.
        #[arg(long = "setting", value_parser = setting)]
        settings: Vec<(String, String)>,
        /// The account's credential (from the environment, never the command line).
        #[arg(long, env = "BCX_CREDENTIAL", hide_env_values = true)]
        credential: String,
        #[arg(long, default_value = "H100")]
        gpu_model: String,
        /// A key no earlier run used.
        #[arg(long)]
        key: String,
    },
    /// Run the conformance suite against a running BMC driver (power and boot): powers the machine behind the BMC
    /// on, then off, and sets its next boot from the network.
    ConformanceBmc {
        /// The driver's URL, such as https://127.0.0.1:7443.
        #[arg(long)]
        driver: String,
        #[command(flatten)]
        identity: IdentityArgs,
        /// The BMC's address, as a machine is enrolled with it.
        #[arg(long)]
        address: String,
        #[arg(long)]
        username: String,
        /// The BMC's password (from the environment, never the command line).
        #[arg(long, env = "BCX_BMC_PASSWORD", hide_env_values = true)]
        password: String,
        /// The system behind the BMC, when it holds several.
        #[arg(long)]
        system_id: Option<String>,
    },
}

/// This side's identity: its certificate and key, and the CA it accepts the other side's certificates from.
#[derive(Debug, clap::Args)]
struct IdentityArgs {
    #[arg(long, env = "BCX_CA")]
    ca: PathBuf,
    #[arg(long, env = "BCX_CERT")]
    cert: PathBuf,
    #[arg(long, env = "BCX_KEY")]
    key_file: PathBuf,
}

impl IdentityArgs {
    fn load(&self) -> anyhow::Result<bcx::tls::Identity> {
        bcx::tls::Identity::load(&self.ca, &self.cert, &self.key_file)
    }
}

fn setting(text: &str) -> Result<(String, String), String> {
    text.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| "expected key=value".to_owned())
}

fn main() -> std::process::ExitCode {
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bcx: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn start() -> anyhow::Result<()> {
    bc_pki::tls::install_default_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match Cli::parse() {
            Cli::Serve { listen, identity, trust } => {
                let trust = trust
                    .map(|path| std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display())))
                    .transpose()?;
                let driver = bcx::better_compute::BetterCompute::new(trust.as_deref())?;
                let listener =
                    tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listen on {listen}"))?;
                eprintln!("bcx: serving {} on https://{}", bcx::better_compute::NAME, listener.local_addr()?);
                let driver =
                    bcx::server::Driver::provider(bcx::better_compute::NAME, env!("CARGO_PKG_VERSION"), driver);
                let stop = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                bcx::server::serve(listener, &identity.load()?, driver, stop).await
            }
            Cli::Conformance { driver, identity, endpoint, settings, credential, gpu_model, key } => {
                let client = bcx::client::DriverClient::new(&driver, &identity.load()?)?;
                let setup = bcx::conformance::Setup {
                    account: bcx::protocol::Account {
                        account_id: "conformance".into(),
                        endpoint,
                        settings: settings.into_iter().collect(),
                        credential,
                    },
                    gpu_model,
                    key,
                    patience: Duration::from_secs(120),
                };
                let passed = bcx::conformance::provider(&client, &setup).await?;
                for check in passed {
                    println!("ok: {check}");
                }
                Ok(())
            }
            Cli::ConformanceBmc { driver, identity, address, username, password, system_id } => {
                let client = bcx::client::DriverClient::new(&driver, &identity.load()?)?;
                let target = bcx::protocol::BmcTarget { address, username, password, system_id };
                for check in bcx::conformance::bmc(&client, &target).await? {
                    println!("ok: {check}");
                }
                Ok(())
            }
        }
    })
}
