//! Tests of `inventory`.

use super::*;

fn document() -> NodeInventory {
    let mut doc = NodeInventory::new(SystemSection {
        hostname: "gpu-01".into(),
        machine_id: Some("0f1e2d3c4b5a69788796a5b4c3d2e1f0".into()),
        os: "Debian 12".into(),
        kernel: "6.1.0".into(),
        cpu_model: "AMD EPYC 9454".into(),
        cpu_cores: 96,
        memory_mib: 1_548_288,
        ..SystemSection::default()
    });
    doc.gpus.push(GpuSection {
        info: GpuInfo {
            uuid: "GPU-0000".parse().expect("uuid"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            pci_bus_id: Some("00000000:18:00.0".into()),
            mig_instances: Vec::new(),
        },
        serial: Some("1650123456789".into()),
        mig_enabled: false,
        nvlink_peers: Vec::new(),
    });
    doc.nics.push(NicSection {
        name: "eth0".into(),
        mac: "02:00:00:00:00:01".into(),
        speed_mbps: None,
        pci_bus_id: None,
    });
    doc
}

#[test]
fn a_first_report_sends_every_section_and_rebuilds_the_document() {
    let doc = document();
    let report = doc.report(&SectionHashes::new());
    assert!(report.system.is_some() && report.gpus.is_some() && report.nics.is_some() && report.disks.is_some());
    assert_eq!(report.apply(None).expect("applies"), doc);
}

#[test]
fn an_unchanged_section_is_not_sent_again_and_the_held_one_is_kept() {
    let doc = document();
    let held = doc.clone();
    let mut changed = doc.clone();
    changed.system.kernel = "6.1.1".into();
    let report = changed.report(&held.hashes());
    assert!(report.system.is_some(), "the changed section is sent");
    assert_eq!((report.gpus.is_none(), report.nics.is_none(), report.disks.is_none()), (true, true, true));
    assert_eq!(report.apply(Some(&held)).expect("applies"), changed);
    assert!(doc.report(&held.hashes()).system.is_none(), "nothing changed, nothing sent");
}

#[test]
fn hashes_follow_the_content_not_the_instance() {
    assert_eq!(document().hashes(), document().hashes());
    let mut other = document();
    other.gpus[0].info.memory_mib += 1;
    assert_ne!(other.hash(Section::Gpus), document().hash(Section::Gpus));
    assert_eq!(other.hash(Section::System), document().hash(Section::System));
    assert!(document().hash(Section::Disks).starts_with("sha256:"));
}

#[test]
fn a_report_that_leaves_out_a_section_the_control_plane_lacks_is_refused() {
    let doc = document();
    let mut stale = doc.hashes();
    stale.insert(Section::Gpus, "sha256:00".into());
    // The agent believes the control plane holds other GPUs than it does.
    let mut report = doc.report(&doc.hashes());
    report.hashes = stale;
    assert_eq!(report.apply(Some(&doc)), Err(ReportError::Missing(Section::Gpus)));
    assert_eq!(doc.report(&doc.hashes()).apply(None), Err(ReportError::Missing(Section::System)));
}

#[test]
fn a_section_that_does_not_match_its_hash_or_a_wrong_schema_is_refused() {
    let doc = document();
    let mut report = doc.report(&SectionHashes::new());
    report.nics.as_mut().expect("sent").push(NicSection {
        name: "eth1".into(),
        mac: "02:00:00:00:00:02".into(),
        speed_mbps: None,
        pci_bus_id: None,
    });
    assert_eq!(report.apply(None), Err(ReportError::HashMismatch(Section::Nics)));
    let mut report = doc.report(&SectionHashes::new());
    report.schema = "NodeInventory/v2".into();
    assert!(matches!(report.apply(None), Err(ReportError::Schema(_))));
}
