//! Tests of `device`.

use super::*;

fn h100(uuid: &str, mig: &[(u32, u32)]) -> GpuInfo {
    GpuInfo {
        uuid: uuid.parse().expect("uuid"),
        name: "NVIDIA H100 80GB HBM3".to_owned(),
        memory_mib: 81_559,
        pci_bus_id: Some("00000000:18:00.0".to_owned()),
        mig_instances: mig
            .iter()
            .map(|&(g, c)| MigInstance {
                gpu_instance: g,
                compute_instance: c,
                profile: "1g.10gb".to_owned(),
                memory_mib: 9_856,
            })
            .collect(),
    }
}

fn atoms(devices: &[Device]) -> Vec<(&str, DeviceClass)> {
    devices.iter().filter(|d| d.bookable).map(|d| (d.id.as_str(), d.class)).collect()
}

#[test]
fn exclusive_pools_book_whole_gpus() {
    let (devices, unknown) = devices_for(&[h100("GPU-a", &[]), h100("GPU-b", &[])], Sharing::Exclusive, 1);
    assert!(unknown.is_empty());
    assert_eq!(atoms(&devices), vec![("GPU-a", DeviceClass::Gpu), ("GPU-b", DeviceClass::Gpu)]);
    assert_eq!(devices[0].gpu_model, "H100");
    assert_eq!(devices[0].gpu_product, "H100-SXM5-80GB");
}

#[test]
fn mig_pools_book_instances_and_never_the_partitioned_gpu() {
    let (devices, _) = devices_for(&[h100("GPU-a", &[(1, 0), (2, 0)])], Sharing::Mig, 1);
    assert_eq!(atoms(&devices), vec![("GPU-a/gi1/ci0", DeviceClass::GpuMig), ("GPU-a/gi2/ci0", DeviceClass::GpuMig)]);
    let parent = devices.iter().find(|d| d.id.as_str() == "GPU-a").expect("parent");
    assert!(!parent.bookable);
    assert_eq!(devices[1].parent.as_ref().map(DeviceId::as_str), Some("GPU-a"));
    // A partitioned GPU in an exclusive pool is not bookable either.
    let (devices, _) = devices_for(&[h100("GPU-a", &[(1, 0)])], Sharing::Exclusive, 1);
    assert!(atoms(&devices).is_empty());
}

#[test]
fn sharing_pools_book_replicas_slots_per_gpu() {
    let (devices, _) = devices_for(&[h100("GPU-a", &[])], Sharing::Timeslice, 3);
    assert_eq!(
        atoms(&devices),
        vec![
            ("GPU-a/s0", DeviceClass::GpuSlot),
            ("GPU-a/s1", DeviceClass::GpuSlot),
            ("GPU-a/s2", DeviceClass::GpuSlot)
        ]
    );
    assert!(!devices[0].bookable, "the GPU itself is the slots' parent");
}

#[test]
fn unknown_gpu_names_are_reported_once() {
    let mut odd = h100("GPU-x", &[]);
    odd.name = "NVIDIA Imaginary 9000".to_owned();
    let mut odd2 = odd.clone();
    odd2.uuid = "GPU-y".parse().expect("uuid");
    let (devices, unknown) = devices_for(&[odd, odd2], Sharing::Exclusive, 1);
    assert_eq!(unknown, vec!["NVIDIA Imaginary 9000".to_owned()]);
    assert_eq!(devices[0].gpu_model, "other");
}

#[test]
fn gpu_uuids_leave_room_for_the_ids_made_from_them() {
    let mut gpu = h100("GPU-a", &[]);
    gpu.uuid = format!("GPU-{}", "a".repeat(MAX_GPU_UUID - 4)).parse().expect("uuid");
    check_gpus("gpus", [&gpu]).expect("the longest accepted UUID");
    // The longest suffixes: `/gi<u32::MAX>/ci<u32::MAX>` and `/s<u32::MAX>`.
    for id in [DeviceId::mig(&gpu.uuid, u32::MAX, u32::MAX), DeviceId::slot(&gpu.uuid, u32::MAX)] {
        assert_eq!(id.to_string().parse::<DeviceId>().expect("reads back"), id);
    }
    let mut longer = gpu.clone();
    longer.uuid = format!("GPU-{}", "a".repeat(MAX_GPU_UUID - 3)).parse().expect("uuid");
    let err = check_gpus("gpus", [&gpu, &longer]).expect_err("too long");
    assert!(matches!(err, crate::Rejection::InvalidArgument { ref field, .. } if field == "gpus[1].uuid"), "{err:?}");
    let err = check_gpus("gpus", [&gpu, &gpu]).expect_err("twice");
    assert!(err.to_string().contains("listed twice"), "{err}");
}

#[test]
fn a_nul_character_is_found_wherever_it_is() {
    let value = serde_json::json!({ "a": ["x", { "b": "y\u{0}" }], "c": "z" });
    assert_eq!(first_nul(&value, "body").as_deref(), Some("body.a[1].b"));
    assert_eq!(first_nul(&serde_json::json!({ "a": ["x"] }), "body"), None);
}

#[test]
fn classes_use_the_seed_spellings() {
    assert_eq!(serde_json::to_string(&DeviceClass::GpuMig).expect("json"), "\"gpu.mig\"");
    assert_eq!("gpu.slot".parse::<DeviceClass>(), Ok(DeviceClass::GpuSlot));
    assert!("gpus".parse::<DeviceClass>().is_err());
}
