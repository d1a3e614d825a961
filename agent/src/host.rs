//! This machine's facts apart from its GPUs (the system section, NICs and disks), read from `/proc`, `/sys` and
//! `/etc` on Linux. A file that is missing or unreadable (DMI serials are often root-only) leaves its field empty
//! or at a default; nothing here fails or panics. Parsing is kept apart from reading so it is tested on fixtures.

use std::fs;
use std::path::Path;

use bc_domain::inventory::{DiskSection, NicSection, SystemSection};

/// The root of the real file system; tests pass a fixture tree instead.
const ROOT: &str = "/";

/// What a field says when its source could not be read.
const UNKNOWN: &str = "unknown";

/// The system section: `hostname` when given, otherwise the kernel's host name. The NVIDIA driver and CUDA
/// versions are left empty; NVML fills them.
pub fn system_section(hostname: Option<&str>) -> SystemSection {
    system_section_at(Path::new(ROOT), hostname)
}

/// The physical NICs, sorted by interface name.
pub fn nics() -> Vec<NicSection> {
    nics_at(Path::new(ROOT))
}

/// The physical disks, sorted by device name.
pub fn disks() -> Vec<DiskSection> {
    disks_at(Path::new(ROOT))
}

/// A file's text, trimmed; `None` when it is missing, unreadable, not UTF-8 or blank.
fn read_trimmed(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn system_section_at(root: &Path, hostname: Option<&str>) -> SystemSection {
    let read = |relative: &str| read_trimmed(&root.join(relative));
    let hostname = hostname
        .map(str::to_owned)
        .or_else(|| read("proc/sys/kernel/hostname"))
        .or_else(|| read("etc/hostname"))
        .unwrap_or_else(|| "localhost".to_owned());
    let cpu = read("proc/cpuinfo").map(|text| parse_cpuinfo(&text)).unwrap_or_default();
    let cpu_cores = if cpu.processors > 0 {
        cpu.processors
    } else {
        // Without /proc/cpuinfo, the CPUs this process may use are the best estimate left.
        std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
    };
    SystemSection {
        hostname,
        machine_id: read("etc/machine-id"),
        product_uuid: read("sys/class/dmi/id/product_uuid"),
        board_serial: read("sys/class/dmi/id/product_serial").or_else(|| read("sys/class/dmi/id/board_serial")),
        // os-release(5): /etc/os-release, or /usr/lib/os-release when /etc has none.
        os: read("etc/os-release")
            .or_else(|| read("usr/lib/os-release"))
            .and_then(|text| parse_os_release(&text))
            .unwrap_or_else(|| UNKNOWN.to_owned()),
        kernel: read("proc/sys/kernel/osrelease").unwrap_or_else(|| UNKNOWN.to_owned()),
        cpu_model: cpu.model.unwrap_or_else(|| UNKNOWN.to_owned()),
        cpu_cores,
        memory_mib: read("proc/meminfo").and_then(|text| parse_meminfo(&text)).unwrap_or(0),
        driver_version: None,
        cuda_version: None,
    }
}

/// What `/proc/cpuinfo` says: the CPU model and the number of logical CPUs (hardware threads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CpuInfo {
    model: Option<String>,
    processors: u32,
}

/// Parses `/proc/cpuinfo`. x86 names its model in `model name`; arm64 has only the implementer and part
/// numbers, which name the core for the server parts we know (Grace is a Neoverse V2).
fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    let (mut implementer, mut part) = (None, None);
    for (key, value) in text.lines().filter_map(|line| line.split_once(':')) {
        let value = value.trim();
        match key.trim() {
            "processor" => info.processors += 1,
            "model name" | "cpu model" if info.model.is_none() && !value.is_empty() => {
                info.model = Some(value.to_owned());
            }
            "CPU implementer" if implementer.is_none() => implementer = Some(value.to_ascii_lowercase()),
            "CPU part" if part.is_none() => part = Some(value.to_ascii_lowercase()),
            _ => {}
        }
    }
    if info.model.is_none()
        && let (Some(implementer), Some(part)) = (implementer, part)
    {
        info.model = Some(match (implementer.as_str(), part.as_str()) {
            ("0x41", "0xd0c") => "ARM Neoverse-N1".to_owned(),
            ("0x41", "0xd40") => "ARM Neoverse-V1".to_owned(),
            ("0x41", "0xd49") => "ARM Neoverse-N2".to_owned(),
            ("0x41", "0xd4f") => "ARM Neoverse-V2".to_owned(),
            _ => format!("CPU implementer {implementer} part {part}"),
        });
    }
    info
}

/// The total memory in MiB from `/proc/meminfo` (whose `kB` are KiB).
fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kib / 1024)
}

/// The operating system's name from os-release(5): `PRETTY_NAME`, or `NAME` when it has none.
fn parse_os_release(text: &str) -> Option<String> {
    let mut name = None;
    for line in text.lines().map(str::trim).filter(|line| !line.starts_with('#')) {
        let Some((key, value)) = line.split_once('=') else { continue };
        let value = unquote(value.trim());
        match key.trim() {
            "PRETTY_NAME" if !value.is_empty() => return Some(value),
            "NAME" if !value.is_empty() => name = Some(value),
            _ => {}
        }
    }
    name
}

/// An os-release value without its shell quoting: double quotes allow the escapes `\"`, `\\`, `` \` `` and `\$`.
fn unquote(value: &str) -> String {
    if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return inner.to_owned();
    }
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('\\', Some(next @ ('"' | '\\' | '`' | '$'))) => {
                out.push(next);
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

fn nics_at(root: &Path) -> Vec<NicSection> {
    let Ok(entries) = fs::read_dir(root.join("sys/class/net")) else { return Vec::new() };
    let mut nics: Vec<NicSection> =
        entries.flatten().filter_map(|entry| nic(&entry.path(), &entry.file_name().to_string_lossy())).collect();
    nics.sort_by(|a, b| a.name.cmp(&b.name));
    nics
}

/// One interface of `/sys/class/net`, when it is a physical NIC.
fn nic(dir: &Path, name: &str) -> Option<NicSection> {
    // Physical NICs have a `device` link to their bus device; loopback, bridges, bonds, VLANs, veths and tunnels
    // have none. SR-IOV virtual functions have one too, but they come and go with the SR-IOV configuration.
    let device = dir.join("device");
    if name == "lo" || !device.exists() || device.join("physfn").exists() {
        return None;
    }
    Some(NicSection {
        name: name.to_owned(),
        mac: permanent_mac(dir)?,
        // `speed` is -1, or unreadable, while the link is down.
        speed_mbps: read_trimmed(&dir.join("speed"))
            .and_then(|speed| speed.parse::<i64>().ok())
            .filter(|&speed| speed > 0)
            .and_then(|speed| u32::try_from(speed).ok()),
        pci_bus_id: pci_bus_id(&device),
    })
}

/// The NIC's own MAC: `address` when `addr_assign_type` is 0 (the permanent address); for a bonded port, whose
/// `address` is the bond's, the one the bonding driver kept; otherwise the current address, the best there is.
fn permanent_mac(dir: &Path) -> Option<String> {
    let address = read_trimmed(&dir.join("address")).map(|mac| mac.to_ascii_lowercase());
    if read_trimmed(&dir.join("addr_assign_type")).as_deref() == Some("0") {
        return address;
    }
    read_trimmed(&dir.join("bonding_slave/perm_hwaddr")).map(|mac| mac.to_ascii_lowercase()).or(address)
}

/// The PCI address (`0000:18:00.0`) of the device a `device` link points to: the link's own target for a PCI
/// function, or the nearest PCI ancestor for a device on a bus below PCI (a virtio device, say).
fn pci_bus_id(device_link: &Path) -> Option<String> {
    let target = fs::canonicalize(device_link).ok()?;
    target
        .ancestors()
        .filter_map(|path| path.file_name()?.to_str())
        .find(|name| is_pci_address(name))
        .map(str::to_ascii_lowercase)
}

/// Whether `name` is a PCI address `<domain>:<bus>:<device>.<function>` in hex.
fn is_pci_address(name: &str) -> bool {
    let hex = |s: &str, len: usize| s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit());
    let mut parts = name.split(':');
    let (Some(domain), Some(bus), Some(slot), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Some((device, function)) = slot.split_once('.') else { return false };
    (hex(domain, 4) || hex(domain, 8)) && hex(bus, 2) && hex(device, 2) && hex(function, 1)
}

fn disks_at(root: &Path) -> Vec<DiskSection> {
    let Ok(entries) = fs::read_dir(root.join("sys/block")) else { return Vec::new() };
    let mut disks: Vec<DiskSection> =
        entries.flatten().filter_map(|entry| disk(&entry.path(), &entry.file_name().to_string_lossy())).collect();
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    disks
}

/// One entry of `/sys/block`, when it is a physical disk.
fn disk(dir: &Path, name: &str) -> Option<DiskSection> {
    const VIRTUAL: [&str; 4] = ["loop", "ram", "zram", "dm-"];
    // Software devices (md, nbd and the like) have no `device` link; removable media (a USB stick, the BMC's
    // virtual CD drive) are not part of the machine.
    if VIRTUAL.iter().any(|prefix| name.starts_with(prefix))
        || !dir.join("device").exists()
        || read_trimmed(&dir.join("removable")).as_deref() == Some("1")
    {
        return None;
    }
    let serial = ["device/serial", "serial", "device/wwid", "wwid"]
        .iter()
        .find_map(|relative| read_trimmed(&dir.join(relative)));
    Some(DiskSection {
        name: name.to_owned(),
        serial,
        // `size` counts 512-byte sectors whatever the disk's block size.
        size_bytes: read_trimmed(&dir.join("size"))
            .and_then(|sectors| sectors.parse::<u64>().ok())
            .map_or(0, |sectors| sectors.saturating_mul(512)),
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    use crate::fixture::Fixture;

    const X86_CPUINFO: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454 48-Core \
        Processor\ncpu cores\t: 48\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454 \
        48-Core Processor\ncpu cores\t: 48\n";

    #[test]
    fn cpuinfo_gives_the_model_and_counts_logical_cpus() {
        let info = parse_cpuinfo(X86_CPUINFO);
        assert_eq!(info.model.as_deref(), Some("AMD EPYC 9454 48-Core Processor"));
        assert_eq!(info.processors, 2);
        let grace = "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n\n\
            processor\t: 1\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n";
        assert_eq!(parse_cpuinfo(grace), CpuInfo { model: Some("ARM Neoverse-V2".into()), processors: 2 });
        let other = parse_cpuinfo("processor : 0\nCPU implementer : 0x61\nCPU part : 0x022\n");
        assert_eq!(other.model.as_deref(), Some("CPU implementer 0x61 part 0x022"));
        assert_eq!(parse_cpuinfo(""), CpuInfo::default());
    }

    #[test]
    fn meminfo_gives_the_total_in_mib() {
        let text = "MemTotal:       24684084 kB\nMemFree:        23717616 kB\nMemAvailable:   24230400 kB\n";
        assert_eq!(parse_meminfo(text), Some(24_105));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: lots\n"), None);
    }

    #[test]
    fn os_release_gives_the_pretty_name_unquoted() {
        let debian =
            "# comment\nNAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n";
        assert_eq!(parse_os_release(debian).as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(parse_os_release("NAME='Rocky Linux'\nID=rocky\n").as_deref(), Some("Rocky Linux"));
        assert_eq!(
            parse_os_release("PRETTY_NAME=\"A \\\"quoted\\\" \\$name\"\n").as_deref(),
            Some("A \"quoted\" $name")
        );
        assert_eq!(parse_os_release("NAME=Plain\nPRETTY_NAME=\"\"\n").as_deref(), Some("Plain"));
        assert_eq!(parse_os_release("ID=none\n"), None);
    }

    #[test]
    fn pci_addresses_are_recognised_in_both_domain_widths() {
        assert!(is_pci_address("0000:18:00.0"));
        assert!(is_pci_address("00000000:af:1f.7"));
        for not in ["virtio2", "pci0000:00", "0000:18:00", "0000:18:00.0:1", "0000:g8:00.0", "nvme0"] {
            assert!(!is_pci_address(not), "{not}");
        }
    }

    #[test]
    fn a_fixture_machine_reads_into_its_sections() {
        let root = Fixture::new("host-machine");
        root.file("proc/sys/kernel/hostname", "gpu-01\n");
        root.file("etc/machine-id", "0f1e2d3c4b5a69788796a5b4c3d2e1f0\n");
        root.file("sys/class/dmi/id/product_uuid", "4c4c4544-0042-3510-8051-b4c04f4e3332\n");
        // The product serial is root-only here: the board serial stands in.
        root.file("sys/class/dmi/id/board_serial", ".7H5Q3Q2.CNFCP0012A00B4.\n");
        root.file("usr/lib/os-release", "PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n");
        root.file("proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
        root.file("proc/cpuinfo", X86_CPUINFO);
        root.file("proc/meminfo", "MemTotal:       1585446912 kB\n");

        let system = system_section_at(&root.0, None);
        assert_eq!(system.hostname, "gpu-01");
        assert_eq!(system.machine_id.as_deref(), Some("0f1e2d3c4b5a69788796a5b4c3d2e1f0"));
        assert_eq!(system.product_uuid.as_deref(), Some("4c4c4544-0042-3510-8051-b4c04f4e3332"));
        assert_eq!(system.board_serial.as_deref(), Some(".7H5Q3Q2.CNFCP0012A00B4."));
        assert_eq!(system.os, "Ubuntu 24.04.1 LTS");
        assert_eq!(system.kernel, "6.8.0-45-generic");
        assert_eq!(system.cpu_model, "AMD EPYC 9454 48-Core Processor");
        assert_eq!((system.cpu_cores, system.memory_mib), (2, 1_548_288));
        assert_eq!(system_section_at(&root.0, Some("given")).hostname, "given");

        root.file("sys/class/dmi/id/product_serial", "CZ2D1W0ABC\n");
        assert_eq!(system_section_at(&root.0, None).board_serial.as_deref(), Some("CZ2D1W0ABC"));
    }

    #[test]
    fn an_empty_root_gives_defaults_without_failing() {
        let root = Fixture::new("host-empty");
        let system = system_section_at(&root.0, None);
        assert_eq!(system.hostname, "localhost");
        assert_eq!((system.machine_id, system.product_uuid, system.board_serial), (None, None, None));
        assert_eq!(
            (system.os.as_str(), system.kernel.as_str(), system.cpu_model.as_str()),
            (UNKNOWN, UNKNOWN, UNKNOWN)
        );
        assert!(system.cpu_cores >= 1);
        assert_eq!(system.memory_mib, 0);
        assert!(nics_at(&root.0).is_empty());
        assert!(disks_at(&root.0).is_empty());
    }

    #[test]
    fn only_physical_nics_are_listed_with_their_permanent_mac_and_pci_address() {
        let root = Fixture::new("host-nics");
        root.dir("sys/devices/pci0000:00/0000:00:03.0/virtio2");
        root.dir("sys/devices/pci0000:17/0000:18:00.0");
        root.dir("sys/devices/pci0000:17/0000:18:00.1");
        root.dir("sys/devices/pci0000:17/0000:18:00.2/physfn");
        // A virtio NIC: its PCI address is its device's parent.
        root.link("sys/class/net/eth0/device", "../../../devices/pci0000:00/0000:00:03.0/virtio2");
        root.file("sys/class/net/eth0/address", "02:FC:00:00:00:01\n");
        root.file("sys/class/net/eth0/addr_assign_type", "0\n");
        root.file("sys/class/net/eth0/speed", "-1\n");
        // A bonded port: its current address is the bond's.
        root.link("sys/class/net/ens1f0/device", "../../../devices/pci0000:17/0000:18:00.0");
        root.file("sys/class/net/ens1f0/address", "b8:3f:d2:00:00:99\n");
        root.file("sys/class/net/ens1f0/addr_assign_type", "3\n");
        root.file("sys/class/net/ens1f0/bonding_slave/perm_hwaddr", "b8:3f:d2:00:00:10\n");
        root.file("sys/class/net/ens1f0/speed", "100000\n");
        // A port whose address was set by hand, with no permanent one to be had.
        root.link("sys/class/net/ens1f1/device", "../../../devices/pci0000:17/0000:18:00.1");
        root.file("sys/class/net/ens1f1/address", "b8:3f:d2:00:00:11\n");
        root.file("sys/class/net/ens1f1/addr_assign_type", "3\n");
        // Neither a virtual function nor a software interface is a NIC of the machine.
        root.link("sys/class/net/ens1f0v0/device", "../../../devices/pci0000:17/0000:18:00.2");
        root.file("sys/class/net/ens1f0v0/address", "b8:3f:d2:00:00:12\n");
        root.file("sys/class/net/lo/address", "00:00:00:00:00:00\n");
        root.file("sys/class/net/bond0/address", "b8:3f:d2:00:00:99\n");

        let nics = nics_at(&root.0);
        let summary: Vec<(&str, &str, Option<u32>, Option<&str>)> =
            nics.iter().map(|n| (n.name.as_str(), n.mac.as_str(), n.speed_mbps, n.pci_bus_id.as_deref())).collect();
        assert_eq!(
            summary,
            vec![
                ("ens1f0", "b8:3f:d2:00:00:10", Some(100_000), Some("0000:18:00.0")),
                ("ens1f1", "b8:3f:d2:00:00:11", None, Some("0000:18:00.1")),
                ("eth0", "02:fc:00:00:00:01", None, Some("0000:00:03.0")),
            ]
        );
    }

    #[test]
    fn only_physical_disks_are_listed_with_size_and_serial() {
        let root = Fixture::new("host-disks");
        root.file("sys/block/nvme1n1/size", "7501476528\n");
        root.file("sys/block/nvme1n1/device/serial", "  S64ANS0T512345  \n");
        root.file("sys/block/nvme1n1/wwid", "eui.36344730545123450025384500000001\n");
        root.file("sys/block/nvme0n1/size", "3750748848\n");
        root.file("sys/block/nvme0n1/wwid", "eui.0025388b91b2c3d4\n");
        root.dir("sys/block/nvme0n1/device");
        root.file("sys/block/sda/size", "1000\n");
        root.file("sys/block/sda/device/wwid", "naa.5000c500a1b2c3d4\n");
        root.file("sys/block/vda/size", "0\n");
        root.dir("sys/block/vda/device");
        for skipped in ["loop0", "ram0", "zram0", "dm-0", "md0"] {
            root.file(&format!("sys/block/{skipped}/size"), "2048\n");
        }
        root.dir("sys/block/loop0/device");
        root.file("sys/block/sdb/size", "4096\n");
        root.file("sys/block/sdb/removable", "1\n");
        root.dir("sys/block/sdb/device");

        let disks = disks_at(&root.0);
        let summary: Vec<(&str, Option<&str>, u64)> =
            disks.iter().map(|d| (d.name.as_str(), d.serial.as_deref(), d.size_bytes)).collect();
        assert_eq!(
            summary,
            vec![
                ("nvme0n1", Some("eui.0025388b91b2c3d4"), 1_920_383_410_176),
                ("nvme1n1", Some("S64ANS0T512345"), 3_840_755_982_336),
                ("sda", Some("naa.5000c500a1b2c3d4"), 512_000),
                ("vda", None, 0),
            ]
        );
    }

    #[test]
    fn this_machine_has_the_given_hostname_and_some_memory() {
        let system = system_section(Some("x"));
        assert_eq!(system.hostname, "x");
        assert!(system.memory_mib > 0, "{system:?}");
        assert!(system.cpu_cores > 0, "{system:?}");
        // Whatever the machine has, its NICs and disks come back sorted.
        let names: Vec<String> = nics().into_iter().map(|n| n.name).collect();
        assert!(names.is_sorted(), "{names:?}");
        let names: Vec<String> = disks().into_iter().map(|d| d.name).collect();
        assert!(names.is_sorted(), "{names:?}");
    }
}
