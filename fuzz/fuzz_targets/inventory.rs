//! The node inventory (`NodeInventory/v1`) as agents send it: any body is parsed the way the API parses JSON
//! bodies (`api/src/http/request.rs`, `parse_json`) as an `InventoryReport` (`POST /v1/agent/inventory`) and as a
//! `JoinRequest` (`POST /v1/agent/join`), and as a stored snapshot document (`api/src/app/agents.rs`,
//! `latest_snapshot`). Reports are applied as the server applies them (`InventoryReport::apply`, against no
//! held document and against one); every document that comes out goes through what the server then does with
//! it (hashes, hardware key, name and acceptance checks, devices) and must survive the snapshot round trip with
//! the same hashes; the device ids it makes must read back. Nothing may panic.
//!
//! A body of two JSON values is also read as a held document followed by a report to apply against it.

#![no_main]

use bc_domain::acceptance::Check;
use bc_domain::agent::JoinRequest;
use bc_domain::device::devices_for;
use bc_domain::hardware::hardware_key;
use bc_domain::id::DeviceId;
use bc_domain::inventory::{InventoryReport, NodeInventory, ReportError, SCHEMA, Section, SectionHashes};
use bc_domain::pool::Sharing;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;

fuzz_target!(|data: &[u8]| {
    if let Some(report) = parse_json::<InventoryReport>(data) {
        check_report(report, None);
    }
    if let Some(join) = parse_json::<JoinRequest>(data) {
        let text = serde_json::to_string(&join).expect("a join request serializes");
        assert_eq!(parse_json::<JoinRequest>(text.as_bytes()).as_ref(), Some(&join), "join round trip: {text}");
        if join.inventory.schema == SCHEMA
            && let Ok(document) = join.inventory.apply(None)
        {
            check_document(&document);
        }
    }
    if let Ok(document) = serde_json::from_slice::<NodeInventory>(data) {
        check_document(&document);
    }
    held_then_report(data);
});

/// How the API reads a JSON body: through `serde_path_to_error`, then nothing but whitespace may follow.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => value,
        Err(err) => {
            // The error names a field: its path and message are read for the answer.
            let _ = (err.path().to_string(), err.inner().to_string());
            return None;
        }
    };
    deserializer.end().ok()?;
    Some(value)
}

/// A report applies the same whether or not a document is held when it sends every section; what it builds
/// has the hashes it names; and it survives the agent-to-server JSON round trip.
fn check_report(report: InventoryReport, held: Option<&NodeInventory>) {
    let text = serde_json::to_string(&report).expect("a report serializes");
    assert_eq!(parse_json::<InventoryReport>(text.as_bytes()).as_ref(), Some(&report), "report round trip: {text}");
    let sends_everything =
        report.system.is_some() && report.gpus.is_some() && report.nics.is_some() && report.disks.is_some();
    let hashes = report.hashes.clone();
    let alone = report.clone().apply(None);
    let applied = report.apply(held);
    if sends_everything {
        assert_eq!(alone, applied, "a report that sends every section does not depend on the held document");
    }
    if let Ok(document) = applied {
        assert_eq!(document.hashes(), hashes, "an applied report's document has the hashes it names");
        check_document(&document);
    }
}

/// Input of two JSON values: a held document, then a report applied against it. Sections the report does not
/// send come from the held document.
fn held_then_report(data: &[u8]) {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<serde_json::Value>();
    let (Some(Ok(held)), Some(Ok(report)), None) = (values.next(), values.next(), values.next()) else { return };
    let (Ok(held), Ok(report)) =
        (serde_json::from_value::<NodeInventory>(held), serde_json::from_value::<InventoryReport>(report))
    else {
        return;
    };
    let sent = [report.system.is_some(), report.gpus.is_some(), report.nics.is_some(), report.disks.is_some()];
    if let Ok(document) = report.clone().apply(Some(&held)) {
        for (section, sent) in Section::ALL.into_iter().zip(sent) {
            if !sent {
                assert_eq!(document.hash(section), held.hash(section), "{section:?} was not sent: the held one stays");
            }
        }
    }
    check_report(report, Some(&held));
}

/// What the server does with an accepted document, and the properties it relies on.
fn check_document(document: &NodeInventory) {
    // Snapshots are stored as `serde_json::to_string` and read back with `serde_json::from_str`.
    let text = serde_json::to_string(document).expect("a document serializes");
    let back: NodeInventory = match serde_json::from_str(&text) {
        Ok(back) => back,
        Err(err) => panic!("a stored snapshot does not read back ({err}): {text}"),
    };
    assert_eq!(&back, document, "snapshot round trip: {text}");
    let hashes = document.hashes();
    assert_eq!(back.hashes(), hashes, "hashes change across the snapshot round trip");
    assert_eq!(serde_json::to_string(&back).expect("serializes"), text, "the JSON is not canonical");
    for (section, hash) in &hashes {
        let hex = hash.strip_prefix("sha256:").unwrap_or_else(|| panic!("{section:?} hash {hash:?}"));
        assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "{section:?} hash {hash:?}");
    }
    let stored_hashes = serde_json::to_string(&hashes).expect("hashes serialize");
    assert_eq!(serde_json::from_str::<SectionHashes>(&stored_hashes).ok().as_ref(), Some(&hashes), "{stored_hashes}");

    // The agent's reports: against nothing held every section is sent; against itself none is. A document of
    // another schema (only a parsed one can be) is refused for it.
    let first = document.report(&SectionHashes::new());
    let unchanged = document.report(&hashes);
    assert!(unchanged.system.is_none() && unchanged.gpus.is_none() && unchanged.nics.is_none());
    assert!(unchanged.disks.is_none(), "an unchanged document sends no section");
    if document.schema == SCHEMA {
        assert_eq!(first.apply(None).as_ref(), Ok(document), "a first report rebuilds the document");
        assert_eq!(unchanged.apply(Some(document)).as_ref(), Ok(document), "an unchanged report keeps the document");
    } else {
        assert_eq!(first.apply(None), Err(ReportError::Schema(document.schema.clone())), "another schema");
    }

    // What the join and the inventory report do next.
    let _ = bc_domain::site::check_name("inventory.system.hostname", &document.system.hostname);
    let identity = document.hardware_identity();
    let key = hardware_key(&identity);
    assert_eq!(hardware_key(&back.hardware_identity()), key, "the hardware key changes across the round trip");
    let gpus: Vec<_> = document.gpus.iter().map(|g| g.info.clone()).collect();
    for gpu in &gpus {
        let _ = bc_domain::gpu::classify(&gpu.name);
    }
    // The server refuses GPUs whose UUIDs leave no room for the device ids made from them, and NUL characters.
    if bc_domain::device::check_gpus("inventory.gpus", &gpus).is_err()
        || bc_domain::device::check_no_nul("inventory", document).is_err()
    {
        return;
    }
    // The devices go into the node's events (`node.joined`, `node.hardware_changed`), whose ids must read back.
    for sharing in [Sharing::Exclusive, Sharing::Mig, Sharing::Timeslice, Sharing::Mps] {
        for device in devices_for(&gpus, sharing, 2).0 {
            let id = device.id.as_str();
            if let Err(err) = id.parse::<DeviceId>() {
                panic!("{sharing:?} makes device id {id:?} ({} characters) that does not read back: {err}", id.len());
            }
        }
    }
    let checks = [
        Check::GpuCount(8),
        Check::MinGpuMemoryMib(80_000),
        Check::DriverPrefix("550.".into()),
        Check::TrustedHardwareKey,
    ];
    for check in &checks {
        let _ = check.failure(document, key.trusted);
    }
}
