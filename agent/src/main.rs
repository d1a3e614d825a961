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

// Parsed once at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
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
    /// Run as the ramdisk a machine boots from the network: claim a session with the boot credential on the
    /// kernel command line (`bc.server`, `bc.token`, `bc.site`, `bc.ca_sha256`) and carry out the workflow's
    /// ramdisk steps: inspect, wipe the disk, write an image, write the deployed machine's configuration.
    Ramdisk {
        /// The kernel command line to read the `bc.*` keys from.
        #[arg(long, default_value = "/proc/cmdline")]
        cmdline: PathBuf,
        /// The disk to wipe and write an image to: a block device (or a plain file standing for one).
        #[arg(long)]
        disk: PathBuf,
        /// The deployed system's configuration partition, mounted: where `write-config` writes.
        #[arg(long)]
        config_dir: PathBuf,
        /// Simulated GPUs instead of NVML: `<count>x<model>[:<MIG profile>*<n>,...]`, such as `8xH100:1g.10gb*7`.
        #[arg(long)]
        simulate: Option<simulate::Simulated>,
        /// The host name to report.
        #[arg(long)]
        hostname: Option<String>,
        /// How often to ask for work while the workflow is not at a ramdisk step, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        poll_ms: u64,
        /// Where the claimed session is kept for a `bcd ramdisk` started again in the same boot (a tmpfs).
        #[arg(long, default_value = "/run/bcd-ramdisk")]
        state_dir: PathBuf,
    },
    /// Run as the site agent: join with role `site` and carry out the site's BMC steps of machines' workflows
    /// (one agent serves a site at a time; more wait as standbys).
    Site {
        #[command(flatten)]
        run: RunArgs,
        /// The CA (PEM) that signs the site's BMC certificates, for BMCs not enrolled with `insecureTls`.
        #[arg(long, env = "BCD_BMC_CA")]
        bmc_ca: Option<PathBuf>,
        /// Serve the site's machines that boot from the network on this address, such as `0.0.0.0:8089`
        /// (iPXE scripts, the ramdisk, images by hash); without it, no boot server.
        #[arg(long, env = "BCD_BOOT_LISTEN")]
        boot_listen: Option<std::net::SocketAddr>,
        /// How the machines reach the boot server, such as `http://10.0.0.2:8089` (default:
        /// `http://<boot-listen>`).
        #[arg(long, env = "BCD_BOOT_URL", requires = "boot_listen")]
        boot_url: Option<String>,
        /// The ramdisk's kernel, served to the machines that boot into it.
        #[arg(long, env = "BCD_RAMDISK_KERNEL", requires = "boot_listen")]
        ramdisk_kernel: Option<PathBuf>,
        /// The ramdisk's initramfs.
        #[arg(long, env = "BCD_RAMDISK_INITRD", requires = "boot_listen")]
        ramdisk_initrd: Option<PathBuf>,
        /// The image cache (default: `<state-dir>/images`).
        #[arg(long, env = "BCD_CACHE_DIR", requires = "boot_listen")]
        cache_dir: Option<PathBuf>,
        /// An out-of-process BMC driver, `name=https://host:port` (repeat for each): a profile or a machine binds
        /// a concern to it as `bcx:<name>`. Called over the driver protocol's mutual TLS with --bcx-cert.
        #[arg(long = "bcx-driver", env = "BCD_BCX_DRIVERS", value_delimiter = ',', requires = "bcx_cert")]
        bcx_drivers: Vec<String>,
        /// The CA (PEM) the drivers' certificates chain to.
        #[arg(long, env = "BCD_BCX_CA", requires = "bcx_cert")]
        bcx_ca: Option<PathBuf>,
        /// This agent's certificate (PEM) for the drivers (`better-compute pki driver-identity`).
        #[arg(long, env = "BCD_BCX_CERT", requires_all = ["bcx_ca", "bcx_key"])]
        bcx_cert: Option<PathBuf>,
        /// Its key (PEM).
        #[arg(long, env = "BCD_BCX_KEY", requires = "bcx_cert")]
        bcx_key: Option<PathBuf>,
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
    #[arg(long, env = "BCD_INSECURE_HTTP", conflicts_with = "ca", value_parser = clap::builder::BoolishValueParser::new())]
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
    #[arg(long, env = "BCD_HOSTNAME")]
    hostname: Option<String>,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// How the node runs its instances (the node of a `vps-host` pool).
#[derive(Debug, clap::Args)]
struct RuntimeArgs {
    /// Run the node's instances: `qemu` (virtual machines). Without it the node runs none.
    #[arg(long = "runtime", env = "BCD_RUNTIME", value_enum)]
    kind: Option<RuntimeKind>,
    /// The instances' folders (disks, console logs, QEMU's pid files); `<state-dir>/instances` by default.
    #[arg(long, env = "BCD_INSTANCES_DIR")]
    instances_dir: Option<PathBuf>,
    /// The QEMU binary.
    #[arg(long, env = "BCD_QEMU", default_value = "qemu-system-x86_64")]
    qemu: PathBuf,
    /// KVM, QEMU's emulation (TCG), or KVM when /dev/kvm can be opened.
    #[arg(long, env = "BCD_ACCEL", value_enum, default_value = "auto")]
    accel: bc_agent::runtime::Accel,
    /// Boot guests with this kernel, their image as the root disk (microVM style).
    #[arg(long, env = "BCD_GUEST_KERNEL")]
    guest_kernel: Option<PathBuf>,
    /// The initramfs booted with --guest-kernel.
    #[arg(long, env = "BCD_GUEST_INITRD", requires = "guest_kernel")]
    guest_initrd: Option<PathBuf>,
    /// The kernel command line booted with --guest-kernel.
    #[arg(long, env = "BCD_GUEST_APPEND", default_value = "console=ttyS0")]
    guest_append: String,
    /// Pass each instance's GPUs through VFIO (bound to vfio-pci on the host), by their PCI addresses.
    #[arg(long, env = "BCD_VFIO", value_parser = clap::builder::BoolishValueParser::new())]
    vfio: bool,
    /// How often to look at the node's instances, in milliseconds.
    #[arg(long, env = "BCD_RUNTIME_POLL_MS", default_value_t = 2000)]
    runtime_poll_ms: u64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RuntimeKind {
    Qemu,
}

impl RuntimeArgs {
    fn config(self, state_dir: &std::path::Path) -> Option<bc_agent::runtime::RuntimeConfig> {
        self.kind.map(|RuntimeKind::Qemu| bc_agent::runtime::RuntimeConfig {
            dir: self.instances_dir.unwrap_or_else(|| state_dir.join("instances")),
            qemu: self.qemu,
            accel: self.accel,
            guest_kernel: self.guest_kernel,
            guest_initrd: self.guest_initrd,
            guest_append: self.guest_append,
            vfio: self.vfio,
            poll: std::time::Duration::from_millis(self.runtime_poll_ms.max(100)),
        })
    }
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
        Command::Ramdisk { cmdline, disk, config_dir, simulate, hostname, poll_ms, state_dir } => {
            let text = std::fs::read_to_string(&cmdline)
                .with_context(|| format!("read the kernel command line {}", cmdline.display()))?;
            let config = bc_agent::ramdisk::RamdiskConfig {
                cmdline: bc_agent::ramdisk::Cmdline::parse(&text)?,
                disk,
                config_dir,
                inventory: source(simulate, hostname),
                poll: std::time::Duration::from_millis(poll_ms.max(10)),
                state_dir: Some(state_dir),
            };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .context("listen for SIGTERM")?;
                let stop = async move {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = terminate.recv() => {}
                    }
                };
                bc_agent::ramdisk::run(config, stop).await
            })
        }
        Command::Site {
            run,
            bmc_ca,
            boot_listen,
            boot_url,
            ramdisk_kernel,
            ramdisk_initrd,
            cache_dir,
            bcx_drivers,
            bcx_ca,
            bcx_cert,
            bcx_key,
        } => {
            let mut external = std::collections::BTreeMap::new();
            if let (Some(ca), Some(cert), Some(key)) = (&bcx_ca, &bcx_cert, &bcx_key) {
                let identity = bcx::tls::Identity::load(ca, cert, key)?;
                for driver in &bcx_drivers {
                    let Some((name, url)) = driver.split_once('=') else {
                        anyhow::bail!("--bcx-driver {driver:?}: expected name=https://host:port");
                    };
                    external.insert(name.to_owned(), bcx::client::DriverClient::new(url, &identity)?);
                }
            }
            let bmc_ca = bmc_ca
                .map(|path| {
                    std::fs::read_to_string(&path).with_context(|| format!("read the BMC CA {}", path.display()))
                })
                .transpose()?;
            for path in [&ramdisk_kernel, &ramdisk_initrd].into_iter().flatten() {
                std::fs::File::open(path).with_context(|| format!("read the ramdisk file {}", path.display()))?;
            }
            let boot = boot_listen
                .map(|listen| {
                    if boot_url.is_none() && listen.ip().is_unspecified() {
                        eprintln!("bcd site: machines cannot reach http://{listen}: give --boot-url");
                    }
                    let url = boot_url.unwrap_or_else(|| format!("http://{listen}"));
                    if !url.starts_with("http://") && !url.starts_with("https://") {
                        anyhow::bail!("--boot-url {url:?} is not an http:// or https:// URL");
                    }
                    Ok(bc_agent::boot::BootConfig {
                        listen,
                        url: url.trim_end_matches('/').to_owned(),
                        kernel: ramdisk_kernel,
                        initrd: ramdisk_initrd,
                        cache_dir: cache_dir.unwrap_or_else(|| run.state_dir.join("images")),
                    })
                })
                .transpose()?;
            run_agent(run, Some(bc_agent::site::SiteConfig { bmc_ca, bmc_timeout: None, boot, external }))
        }
    }
}

fn run_agent(args: RunArgs, site: Option<bc_agent::site::SiteConfig>) -> anyhow::Result<()> {
    let RunArgs { server, ca, insecure_http, join_token, state_dir, cdi_dir, simulate, hostname, runtime } = args;
    let runtime = runtime.config(&state_dir);
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
        runtime,
    };
    let executor = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    executor.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        run(config, stop).await
    })
}
