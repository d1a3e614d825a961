//! The instance runtime: runs the instances the control plane lists for this node as QEMU virtual machines, and
//! drives each one's observed state toward the state its owner wants, reporting every change.
//!
//! Each instance has a folder under the runtime's folder, named by its id: its boot disk (the image, fetched once
//! and checked against its SHA-256), its user data, its console log (kept across restarts, appended to), the QEMU
//! process's pid file, and `instance.json` (what the agent last saw of it and last reported). QEMU
//! runs daemonized, so a virtual machine outlives its agent: an agent started again finds it through the pid
//! file (checked against the process's command line) and leaves it running.
//!
//! An instance the control plane no longer lists (its allocation is being released, or is over) is stopped and
//! its folder removed; the release of a reservation does the same for its instances before the node confirms it.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use bc_domain::agent::{AgentInstance, InstanceStateReport};
use bc_domain::id::{InstanceId, ReservationId};
use bc_domain::image::ImageFormat;
use bc_domain::instance::{DesiredState, InstanceState};
use bc_domain::inventory::NodeInventory;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::sync::watch;

use crate::client::Client;

/// How QEMU accelerates the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// KVM when `/dev/kvm` can be opened, QEMU's emulation (TCG) otherwise.
    Auto,
    Kvm,
    Tcg,
}

/// How the runtime runs instances.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The instances' folders.
    pub dir: PathBuf,
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    pub accel: Accel,
    /// A kernel to boot the guest with directly (the image is then its root disk, as microVMs boot); without it
    /// the guest boots from its image.
    pub guest_kernel: Option<PathBuf>,
    pub guest_initrd: Option<PathBuf>,
    /// The kernel command line, with `guest_kernel`.
    pub guest_append: String,
    /// Pass the allocation's GPUs to the guest through VFIO, by the PCI addresses the inventory reports. The
    /// devices must be bound to `vfio-pci` on the host.
    pub vfio: bool,
    /// How often the runtime asks for its instances.
    pub poll: Duration,
}

/// What an instance's folder keeps of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kept {
    instance: AgentInstance,
    /// The state and generation last reported, once accepted.
    reported: Option<(InstanceState, u64)>,
}

fn folder(config: &RuntimeConfig, id: &InstanceId) -> PathBuf {
    config.dir.join(id.as_str())
}

fn load(dir: &Path) -> Option<Kept> {
    serde_json::from_slice(&std::fs::read(dir.join("instance.json")).ok()?).ok()
}

fn keep(dir: &Path, kept: &Kept) -> anyhow::Result<()> {
    let temporary = dir.join("instance.json.part");
    std::fs::write(&temporary, serde_json::to_vec_pretty(kept)?)?;
    std::fs::rename(&temporary, dir.join("instance.json"))?;
    Ok(())
}

/// The pid of the instance's QEMU process, when one runs: the pid file names a live process whose command line
/// names the instance (a pid reused by another process is not it).
pub fn running_pid(dir: &Path, id: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("qemu.pid")).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let marker = format!("guest={id}");
    let cmdline = String::from_utf8_lossy(&cmdline);
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .is_some_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')));
    (cmdline.split('\0').any(|arg| arg.contains(&marker)) && !zombie).then_some(pid)
}

/// One pass at a time: a release's removal never runs beside a pass that might start the same instance.
static PASS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the runtime until the process ends: each `poll`, with the agent's current client.
/// `inventory` reads the machine's inventory (the GPUs' PCI addresses, for VFIO).
pub async fn serve(
    clients: watch::Receiver<Option<Client>>,
    config: RuntimeConfig,
    inventory: impl Fn() -> NodeInventory + Send + Sync + 'static,
) {
    loop {
        let client = clients.borrow().clone();
        if let Some(client) = client
            && let Err(err) = reconcile(&client, &config, &inventory).await
        {
            eprintln!("bcd runtime: {err:#}");
        }
        tokio::time::sleep(config.poll).await;
    }
}

/// One look: every listed instance driven toward its desired state, every other one stopped and removed.
pub async fn reconcile(
    client: &Client,
    config: &RuntimeConfig,
    inventory: &(dyn Fn() -> NodeInventory + Send + Sync),
) -> anyhow::Result<()> {
    let _pass = PASS.lock().await;
    let listed = client.instances().await?;
    std::fs::create_dir_all(&config.dir).with_context(|| format!("create {}", config.dir.display()))?;
    let wanted: BTreeSet<String> = listed.iter().map(|i| i.instance_id.to_string()).collect();
    for entry in std::fs::read_dir(&config.dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("inst_") && !wanted.contains(&name) {
            let config = config.clone();
            tokio::task::spawn_blocking(move || remove(&config.dir.join(&name), &name)).await??;
        }
    }
    for instance in listed {
        let id = instance.instance_id.clone();
        if let Err(err) = drive(client, config, inventory, instance).await {
            eprintln!("bcd runtime: instance {id}: {err:#}");
        }
    }
    Ok(())
}

/// Stops and removes the instances of reservation `reservation` (its release), before the node confirms it; waits
/// for a pass under way to end first.
pub async fn release(config: &RuntimeConfig, reservation: &ReservationId) -> anyhow::Result<usize> {
    let _pass = PASS.lock().await;
    let (config, reservation) = (config.clone(), reservation.clone());
    tokio::task::spawn_blocking(move || remove_reservation(&config, &reservation)).await?
}

fn remove_reservation(config: &RuntimeConfig, reservation: &ReservationId) -> anyhow::Result<usize> {
    let mut removed = 0;
    let Ok(entries) = std::fs::read_dir(&config.dir) else { return Ok(0) };
    for entry in entries {
        let dir = entry?.path();
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if load(&dir).is_some_and(|kept| &kept.instance.reservation_id == reservation) {
            remove(&dir, &name)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Stops the instance's QEMU and removes its folder.
fn remove(dir: &Path, id: &str) -> anyhow::Result<()> {
    stop(dir, id)?;
    std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))
}

/// Stops the instance's QEMU, if it runs: SIGTERM (QEMU ends the guest and exits), SIGKILL after 10 s.
fn stop(dir: &Path, id: &str) -> anyhow::Result<()> {
    let Some(pid) = running_pid(dir, id) else { return Ok(()) };
    let process = rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| anyhow::anyhow!("pid {pid}"))?;
    let _ = rustix::process::kill_process(process, rustix::process::Signal::TERM);
    for attempt in 0..240 {
        if running_pid(dir, id).is_none() {
            let _ = std::fs::remove_file(dir.join("qemu.pid"));
            return Ok(());
        }
        if attempt == 200 {
            let _ = rustix::process::kill_process(process, rustix::process::Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("QEMU (pid {pid}) did not end")
}

/// Drives one listed instance toward its desired state and reports where it got.
async fn drive(
    client: &Client,
    config: &RuntimeConfig,
    inventory: &(dyn Fn() -> NodeInventory + Send + Sync),
    instance: AgentInstance,
) -> anyhow::Result<()> {
    let dir = folder(config, &instance.instance_id);
    std::fs::create_dir_all(&dir)?;
    let before = load(&dir);
    let reported = before.as_ref().and_then(|kept| kept.reported);
    let id = instance.instance_id.to_string();
    let generation = instance.generation;
    let outcome = match instance.desired {
        DesiredState::Running if running_pid(&dir, &id).is_some() => Ok(InstanceState::Running),
        DesiredState::Running => match prepare(client, &dir, &instance).await {
            Ok(disk) => {
                let command = qemu_command(config, &dir, &instance, &disk, &inventory());
                let (dir, id) = (dir.clone(), id.clone());
                tokio::task::spawn_blocking(move || start(command, &dir, &id)).await?.map(|()| InstanceState::Running)
            }
            Err(err) => Err(err),
        },
        DesiredState::Stopped => {
            let (dir, id) = (dir.clone(), id.clone());
            tokio::task::spawn_blocking(move || stop(&dir, &id)).await?.map(|()| InstanceState::Stopped)
        }
        DesiredState::Deleted => {
            let (dir, id) = (dir.clone(), id.clone());
            tokio::task::spawn_blocking(move || stop(&dir, &id)).await?.map(|()| InstanceState::Deleted)
        }
    };
    let (state, message) = match outcome {
        Ok(state) => (state, None),
        Err(err) => (InstanceState::Failed, Some(format!("{err:#}"))),
    };
    let mut kept = Kept { instance, reported };
    if reported != Some((state, generation)) {
        let report = InstanceStateReport { state, generation, message: message.map(|m| truncate(m, 4096)) };
        client.report_instance(&kept.instance.instance_id, &report).await?;
        kept.reported = Some((state, generation));
    }
    if state == InstanceState::Deleted {
        std::fs::remove_dir_all(&dir)?;
    } else if before.as_ref() != Some(&kept) {
        keep(&dir, &kept)?;
    }
    Ok(())
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The boot disk in the instance's folder: the image fetched once (its bytes checked against the SHA-256 the
/// control plane named), a raw one grown (sparse) to the flavor's disk size; and the user data beside it.
async fn prepare(client: &Client, dir: &Path, instance: &AgentInstance) -> anyhow::Result<(PathBuf, ImageFormat)> {
    let Some(image) = &instance.image else {
        anyhow::bail!("its image was deleted before this node fetched it");
    };
    std::fs::write(dir.join("user-data"), &instance.user_data)?;
    let name = match image.format {
        ImageFormat::Raw => "disk.raw",
        ImageFormat::Qcow2 => "disk.qcow2",
        ImageFormat::Iso => "disk.iso",
    };
    let disk = dir.join(name);
    if disk.exists() {
        return Ok((disk, image.format));
    }
    let partial = dir.join(format!("{name}.part"));
    let mut file = std::fs::File::create(&partial).with_context(|| format!("create {}", partial.display()))?;
    let mut response = client.instance_image(&instance.instance_id).await?;
    let mut hash = sha2::Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = response.chunk().await.context("read the image")? {
        size += chunk.len() as u64;
        if size > image.size {
            anyhow::bail!("the image is larger than its {} bytes", image.size);
        }
        hash.update(&chunk);
        file.write_all(&chunk)?;
    }
    let got = hex::encode(hash.finalize());
    if got != image.sha256 || size != image.size {
        let _ = std::fs::remove_file(&partial);
        anyhow::bail!("the image's bytes hash to {got} ({size} bytes), not {} ({} bytes)", image.sha256, image.size);
    }
    if image.format == ImageFormat::Raw {
        let wanted = u64::from(instance.sizes.disk) << 30;
        if file.metadata()?.len() < wanted {
            file.set_len(wanted)?;
        }
    }
    file.sync_all()?;
    std::fs::rename(&partial, &disk)?;
    Ok((disk, image.format))
}

/// The QEMU command line of an instance.
fn qemu_command(
    config: &RuntimeConfig,
    dir: &Path,
    instance: &AgentInstance,
    (disk, format): &(PathBuf, ImageFormat),
    inventory: &NodeInventory,
) -> std::process::Command {
    let path = |p: &Path| p.display().to_string();
    let mut command = std::process::Command::new(&config.qemu);
    let accel = match config.accel {
        Accel::Kvm => "kvm",
        Accel::Tcg => "tcg",
        Accel::Auto if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok() => "kvm",
        Accel::Auto => "tcg",
    };
    command
        .args(["-name", &format!("{},process=bc-{}", instance.name, instance.instance_id)])
        // The marker `running_pid` finds the process by.
        .args(["-uuid", &uuid_of(&instance.instance_id)])
        .args(["-smbios", &format!("type=1,serial=guest={}", instance.instance_id)])
        .args(["-machine", &format!("q35,accel={accel}")])
        .args(["-smp", &instance.sizes.vcpu.to_string()])
        .args(["-m", &format!("{}M", u64::from(instance.sizes.memory_gib) * 1024)])
        .args(["-display", "none", "-monitor", "none", "-daemonize"])
        .args(["-pidfile", &path(&dir.join("qemu.pid"))])
        .args(["-chardev", &format!("file,id=console,path={},append=on", path(&dir.join("console.log")))])
        .args(["-serial", "chardev:console"])
        .args(["-nic", "user,model=virtio-net-pci"])
        .args(["-fw_cfg", &format!("name=opt/bc/user-data,file={}", path(&dir.join("user-data")))]);
    match format {
        ImageFormat::Iso => command.args(["-cdrom", &path(disk)]),
        ImageFormat::Raw => command.args(["-drive", &format!("file={},format=raw,if=virtio", path(disk))]),
        ImageFormat::Qcow2 => command.args(["-drive", &format!("file={},format=qcow2,if=virtio", path(disk))]),
    };
    if let Some(kernel) = &config.guest_kernel {
        command.arg("-kernel").arg(kernel).args(["-append", &config.guest_append]);
        if let Some(initrd) = &config.guest_initrd {
            command.arg("-initrd").arg(initrd);
        }
    }
    if config.vfio {
        for address in gpu_addresses(instance, inventory) {
            command.args(["-device", &format!("vfio-pci,host={address}")]);
        }
    }
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

/// A stable UUID for the guest, from its instance id.
fn uuid_of(id: &InstanceId) -> String {
    let digest = hex::encode(sha2::Sha256::digest(id.as_str().as_bytes()));
    format!("{}-{}-{}-{}-{}", &digest[0..8], &digest[8..12], &digest[12..16], &digest[16..20], &digest[20..32])
}

/// The PCI addresses of the allocation's GPUs: each atom is a GPU (its UUID) or a slice of one (named under it).
fn gpu_addresses(instance: &AgentInstance, inventory: &NodeInventory) -> Vec<String> {
    let mut addresses = BTreeSet::new();
    for device in &instance.devices {
        let gpu = inventory.gpus.iter().find(|gpu| device.as_str().starts_with(gpu.info.uuid.as_str()));
        if let Some(address) = gpu.and_then(|gpu| gpu.info.pci_bus_id.clone()) {
            addresses.insert(address);
        }
    }
    addresses.into_iter().collect()
}

/// Starts QEMU daemonized: it returns once the guest is created, leaving the pid file behind.
fn start(mut command: std::process::Command, dir: &Path, id: &str) -> anyhow::Result<()> {
    let output = command.output().context("run QEMU")?;
    if !output.status.success() {
        anyhow::bail!("QEMU did not start: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    running_pid(dir, id).map(|_| ()).ok_or_else(|| anyhow::anyhow!("QEMU started, yet no process runs the guest"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_on_a_character_boundary() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("short".into(), 4096), "short");
    }

    #[test]
    fn a_guest_uuid_is_stable_and_well_formed() {
        let id = InstanceId::derive(&"acme".parse().expect("tenant"), &"alice".parse().expect("identity"), "k");
        let uuid = uuid_of(&id);
        assert_eq!(uuid, uuid_of(&id));
        assert_eq!(uuid.len(), 36);
        assert_eq!(uuid.matches('-').count(), 4);
    }

    #[test]
    fn a_pid_file_that_names_another_process_is_not_the_guest() {
        let dir = std::env::temp_dir().join(format!("bc-runtime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("qemu.pid"), std::process::id().to_string()).expect("pid");
        assert_eq!(running_pid(&dir, "inst_x"), None, "this test's own process runs no guest");
        std::fs::write(dir.join("qemu.pid"), "not a pid").expect("pid");
        assert_eq!(running_pid(&dir, "inst_x"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
