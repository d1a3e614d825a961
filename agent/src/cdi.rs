//! Container Device Interface (CDI) specs: one file per reservation naming the GPUs booked for it, so that a
//! container runtime asked for `better-compute.io/gpu=<reservation id>` hands the container exactly those.
//!
//! A spec has one device per booked device (a GPU `GPU-...`, a MIG instance `<gpu>/gi<g>/ci<c>` or a time-slice
//! slot `<gpu>/s<k>`), each setting `NVIDIA_VISIBLE_DEVICES` for the NVIDIA runtime, and one device named after the
//! reservation that sets it for all of them. Each device's annotation keeps the booked id, so the spec reads back.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bc_domain::id::DeviceId;
use serde_json::{Value, json};

/// The CDI version of the specs written: the first with annotations on devices.
pub const CDI_VERSION: &str = "0.6.0";

/// The kind of every device in our specs (`<vendor>/<class>`).
pub const KIND: &str = "better-compute.io/gpu";

/// The spec annotation naming the reservation.
const RESERVATION_ANNOTATION: &str = "better-compute.io/reservation";

/// The device annotation keeping the booked device id.
const DEVICE_ANNOTATION: &str = "better-compute.io/device-id";

/// A booked device as a spec lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CdiDevice {
    /// The booked device id: a GPU UUID like `GPU-...`, a MIG instance `<gpuUuid>/gi<g>/ci<c>`, or a slot
    /// `<gpuUuid>/s<k>`.
    pub id: String,
}

impl CdiDevice {
    /// The device's name in a spec: its id with each character a CDI name does not allow (`/`, `:`) as `_`.
    pub fn name(&self) -> String {
        cdi_name(&self.id)
    }

    /// The fully qualified name a runtime is asked for, `better-compute.io/gpu=<name>`.
    pub fn qualified_name(&self) -> String {
        format!("{KIND}={}", self.name())
    }
}

/// The fully qualified name of the device that holds all of a reservation's devices.
pub fn reservation_device(reservation_id: &str) -> String {
    format!("{KIND}={}", cdi_name(reservation_id))
}

/// Where a reservation's spec lives in `dir`.
pub fn spec_path(dir: &Path, reservation_id: &str) -> PathBuf {
    dir.join(format!("better-compute-{reservation_id}.json"))
}

/// Writes the spec of a reservation's booked `devices` into `dir` (created if missing), atomically: a reader sees
/// the old spec or the new one, never a part. Writing the same devices again, in any order, changes nothing.
///
/// Refuses (`InvalidInput`) an unsafe reservation id, no device, an id that is no GPU, MIG instance or slot, and
/// two ids that would get the same CDI name.
pub fn write_spec(dir: &Path, reservation_id: &str, devices: &[String]) -> io::Result<PathBuf> {
    check_reservation_id(reservation_id)?;
    let ids: BTreeSet<&str> = devices.iter().map(String::as_str).collect();
    if ids.is_empty() {
        return Err(invalid_input(format!("reservation {reservation_id}: no device to write a CDI spec for")));
    }
    let mut names = BTreeMap::from([(cdi_name(reservation_id), reservation_id)]);
    let mut entries = Vec::with_capacity(ids.len() + 1);
    let mut visible = Vec::with_capacity(ids.len());
    for id in ids {
        let visible_device = visible_device(id)?;
        let name = cdi_name(id);
        if !is_valid_name(&name) {
            return Err(invalid_input(format!("device {id:?}: {name:?} is not a valid CDI device name")));
        }
        if let Some(other) = names.insert(name.clone(), id) {
            return Err(invalid_input(format!("devices {other:?} and {id:?} would share the CDI name {name:?}")));
        }
        entries.push(json!({
            "name": name,
            "annotations": { DEVICE_ANNOTATION: id },
            "containerEdits": { "env": [format!("NVIDIA_VISIBLE_DEVICES={visible_device}")] },
        }));
        // Slots of one GPU are that GPU once.
        if !visible.contains(&visible_device) {
            visible.push(visible_device);
        }
    }
    entries.push(json!({
        "name": cdi_name(reservation_id),
        "containerEdits": { "env": [format!("NVIDIA_VISIBLE_DEVICES={}", visible.join(","))] },
    }));
    let spec = json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": { RESERVATION_ANNOTATION: reservation_id },
        "devices": entries,
    });
    let mut bytes = serde_json::to_vec_pretty(&spec).map_err(io::Error::other)?;
    bytes.push(b'\n');

    fs::create_dir_all(dir)?;
    let path = spec_path(dir, reservation_id);
    // Rewriting identical content would only wake the runtimes that watch the directory.
    if fs::read(&path).is_ok_and(|held| held == bytes) {
        return Ok(path);
    }
    write_atomically(dir, &path, &bytes)?;
    Ok(path)
}

/// Removes a reservation's spec: `true` if there was one.
pub fn remove_spec(dir: &Path, reservation_id: &str) -> io::Result<bool> {
    check_reservation_id(reservation_id)?;
    match fs::remove_file(spec_path(dir, reservation_id)) {
        Ok(()) => {
            sync_dir(dir);
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The booked devices a reservation's spec lists, in the spec's order (sorted by id).
pub fn read_spec(dir: &Path, reservation_id: &str) -> io::Result<Vec<CdiDevice>> {
    check_reservation_id(reservation_id)?;
    let path = spec_path(dir, reservation_id);
    let spec: Value = serde_json::from_slice(&fs::read(&path)?)
        .map_err(|e| invalid_data(format!("{}: not JSON ({e})", path.display())))?;
    if spec["kind"] != KIND || spec["annotations"][RESERVATION_ANNOTATION] != reservation_id {
        return Err(invalid_data(format!("{}: not our spec for reservation {reservation_id}", path.display())));
    }
    let devices = spec["devices"]
        .as_array()
        .ok_or_else(|| invalid_data(format!("{}: no devices", path.display())))?
        .iter()
        .filter_map(|device| device["annotations"][DEVICE_ANNOTATION].as_str())
        .map(|id| CdiDevice { id: id.to_owned() })
        .collect();
    Ok(devices)
}

/// Writes `bytes` to `path` through a temporary file in the same directory, flushed to disk before it is renamed
/// over `path`. The temporary name ends in `.tmp`, so runtimes that load `*.json` from the directory skip it.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let file_name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary =
        dir.join(format!(".{file_name}.{}.{}.tmp", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = File::create(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(&temporary, path));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written?;
    sync_dir(dir);
    Ok(())
}

/// Flushes a directory's entries (a rename, a removal) to disk. Best effort: not every file system can sync a
/// directory, and the change itself has already happened.
fn sync_dir(dir: &Path) {
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
}

/// What `NVIDIA_VISIBLE_DEVICES` names for a booked device: a GPU by its UUID, a slot by its GPU's UUID, a MIG
/// instance in the older `MIG-<gpuUuid>/<gi>/<ci>` form, since the booked id names the instance by its GPU and
/// instance ids, not by the `MIG-<uuid>` that current drivers give it.
fn visible_device(id: &str) -> io::Result<String> {
    let not_a_gpu = || invalid_input(format!("device {id:?} is no GPU, MIG instance or slot"));
    let device: DeviceId = id.parse().map_err(|_| not_a_gpu())?;
    let mut parts = device.as_str().split('/');
    let gpu = parts.next().filter(|gpu| gpu.starts_with("GPU-")).ok_or_else(not_a_gpu)?;
    let number = |part: &str, prefix: &str| part.strip_prefix(prefix)?.parse::<u32>().ok();
    match (parts.next(), parts.next(), parts.next()) {
        (None, _, _) => Ok(gpu.to_owned()),
        (Some(gi), Some(ci), None) => match (number(gi, "gi"), number(ci, "ci")) {
            (Some(gi), Some(ci)) => Ok(format!("MIG-{gpu}/{gi}/{ci}")),
            _ => Err(not_a_gpu()),
        },
        (Some(slot), None, None) if number(slot, "s").is_some() => Ok(gpu.to_owned()),
        _ => Err(not_a_gpu()),
    }
}

/// `text` as a CDI device name: every character but ASCII letters, digits, `_`, `-` and `.` becomes `_`. Our ids
/// (GPU UUIDs, `rsv_...`) have no `_` of their own, so this does not make two of them equal.
fn cdi_name(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' }).collect()
}

/// CDI's rule for a device name: letters, digits, `_`, `-`, `.` (and `:` in recent runtimes), beginning and ending
/// with a letter or digit.
fn is_valid_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(allowed)
}

/// A reservation id is part of a file name and a CDI device name: it must be one valid name, so it can neither
/// leave the directory nor hide as a dot file.
fn check_reservation_id(reservation_id: &str) -> io::Result<()> {
    if reservation_id.len() > 200 || !is_valid_name(reservation_id) {
        return Err(invalid_input(format!("{reservation_id:?} cannot name a CDI spec")));
    }
    Ok(())
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn invalid_data(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU_A: &str = "GPU-5b1d9c2e-8f3a-4b6c-9d0e-1f2a3b4c5d6e";
    const GPU_B: &str = "GPU-0c2e4a6b-1d3f-4e5a-8b7c-9d0e1f2a3b4c";
    const RESERVATION: &str = "rsv_7k3m9q2w4e6r8t0y1u3i5o7p9a2s4d6f8g0h1j3k5l7z9x2c4v6b";

    /// A directory under the temporary directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("bc-agent-cdi-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            Scratch(dir)
        }

        /// The spec directory, nested so that writing must create it.
        fn cdi(&self) -> PathBuf {
            self.0.join("run/cdi")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|id| (*id).to_owned()).collect()
    }

    fn spec(path: &Path) -> Value {
        serde_json::from_slice(&fs::read(path).expect("read the spec")).expect("the spec is JSON")
    }

    /// Each device's name and its environment.
    fn devices(spec: &Value) -> Vec<(String, Vec<String>)> {
        spec["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| {
                let env = d["containerEdits"]["env"].as_array().expect("env").iter();
                let env = env.map(|e| e.as_str().expect("a string").to_owned()).collect();
                (d["name"].as_str().expect("a name").to_owned(), env)
            })
            .collect()
    }

    #[test]
    fn a_spec_names_each_booked_device_and_the_reservation_with_all_of_them() {
        let scratch = Scratch::new("write");
        let mig = format!("{GPU_B}/gi1/ci0");
        let slot = format!("{GPU_A}/s3");
        let path = write_spec(&scratch.cdi(), RESERVATION, &ids(&[GPU_A, &mig, &slot])).expect("written");
        assert_eq!(path, scratch.cdi().join(format!("better-compute-{RESERVATION}.json")));
        assert_eq!(path, spec_path(&scratch.cdi(), RESERVATION));

        let spec = spec(&path);
        assert_eq!(spec["cdiVersion"], CDI_VERSION);
        assert_eq!(spec["kind"], "better-compute.io/gpu");
        assert_eq!(spec["annotations"][RESERVATION_ANNOTATION], RESERVATION);
        let visible = |value: &str| vec![format!("NVIDIA_VISIBLE_DEVICES={value}")];
        assert_eq!(
            devices(&spec),
            vec![
                (format!("{GPU_B}_gi1_ci0"), visible(&format!("MIG-{GPU_B}/1/0"))),
                (GPU_A.to_owned(), visible(GPU_A)),
                (format!("{GPU_A}_s3"), visible(GPU_A)),
                (RESERVATION.to_owned(), visible(&format!("MIG-{GPU_B}/1/0,{GPU_A}"))),
            ]
        );
        assert!(devices(&spec).iter().all(|(name, _)| is_valid_name(name)));
        let back: Vec<String> =
            read_spec(&scratch.cdi(), RESERVATION).expect("read back").into_iter().map(|d| d.id).collect();
        assert_eq!(back, ids(&[&mig, GPU_A, &slot]));
        assert_eq!(reservation_device(RESERVATION), format!("better-compute.io/gpu={RESERVATION}"));
        assert_eq!(CdiDevice { id: mig }.qualified_name(), format!("better-compute.io/gpu={GPU_B}_gi1_ci0"));
    }

    #[test]
    fn writing_again_succeeds_and_leaves_one_file() {
        let scratch = Scratch::new("again");
        let first = write_spec(&scratch.cdi(), RESERVATION, &ids(&[GPU_A, GPU_B])).expect("written");
        let bytes = fs::read(&first).expect("read");
        // The same devices in another order, and repeated, are the same spec.
        let again = write_spec(&scratch.cdi(), RESERVATION, &ids(&[GPU_B, GPU_A, GPU_B])).expect("written again");
        assert_eq!((&again, fs::read(&again).expect("read")), (&first, bytes));
        // Other devices replace the spec.
        write_spec(&scratch.cdi(), RESERVATION, &ids(&[GPU_B])).expect("rewritten");
        let back = read_spec(&scratch.cdi(), RESERVATION).expect("read back");
        assert_eq!(back, vec![CdiDevice { id: GPU_B.to_owned() }]);
        let files: Vec<_> = fs::read_dir(scratch.cdi()).expect("list").flatten().map(|e| e.file_name()).collect();
        assert_eq!(files, vec![first.file_name().expect("a file name").to_owned()], "no temporary file is left");
    }

    #[test]
    fn removing_says_whether_there_was_a_spec() {
        let scratch = Scratch::new("remove");
        assert!(!remove_spec(&scratch.cdi(), RESERVATION).expect("nothing to remove, not even the directory"));
        let path = write_spec(&scratch.cdi(), RESERVATION, &ids(&[GPU_A])).expect("written");
        assert!(remove_spec(&scratch.cdi(), RESERVATION).expect("removed"));
        assert!(!path.exists());
        assert!(!remove_spec(&scratch.cdi(), RESERVATION).expect("already removed"));
        let missing = read_spec(&scratch.cdi(), RESERVATION).expect_err("no spec");
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn unusable_reservations_and_devices_are_refused() {
        let scratch = Scratch::new("refused");
        let refused = |reservation: &str, devices: &[&str]| {
            write_spec(&scratch.cdi(), reservation, &ids(devices)).expect_err("refused").kind()
        };
        for reservation in ["", "../escape", "rsv/x", ".hidden", "rsv_x."] {
            assert_eq!(refused(reservation, &[GPU_A]), io::ErrorKind::InvalidInput, "{reservation:?}");
            assert_eq!(
                remove_spec(&scratch.cdi(), reservation).expect_err("refused").kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert_eq!(refused(RESERVATION, &[]), io::ErrorKind::InvalidInput);
        for device in ["nvme0n1", "GPU-a/gi1", "GPU-a/gi1/cix", "GPU-a/x3", "GPU-a/s", "GPU a", "GPU-a."] {
            assert_eq!(refused(RESERVATION, &[device]), io::ErrorKind::InvalidInput, "{device:?}");
        }
        // Two ids that sanitize to one name cannot both be devices of a spec.
        assert_eq!(refused(RESERVATION, &["GPU-a/s1", "GPU-a_s1"]), io::ErrorKind::InvalidInput);
        assert!(!scratch.cdi().join(format!("better-compute-{RESERVATION}.json")).exists());
    }

    #[test]
    fn a_spec_that_is_not_ours_does_not_read_back() {
        let scratch = Scratch::new("foreign");
        fs::create_dir_all(scratch.cdi()).expect("create");
        fs::write(spec_path(&scratch.cdi(), RESERVATION), "{\"kind\": \"nvidia.com/gpu\"}").expect("write");
        assert_eq!(read_spec(&scratch.cdi(), RESERVATION).expect_err("foreign").kind(), io::ErrorKind::InvalidData);
        fs::write(spec_path(&scratch.cdi(), RESERVATION), "not json").expect("write");
        assert_eq!(read_spec(&scratch.cdi(), RESERVATION).expect_err("garbage").kind(), io::ErrorKind::InvalidData);
    }
}
