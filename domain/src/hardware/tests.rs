//! Tests of `hardware`.

use super::*;

const UUID: &str = "4c4c4544-0047-3610-8052-b3c04f4d4e32";
const SERIAL: &str = "CZ2D1234XY";
const MAC_A: &str = "3c:ec:ef:12:34:56";
const MAC_B: &str = "3c:ec:ef:12:34:57";
const GPU_A: &str = "GPU-8810ee8d-809d-de71-575c-e605602c71f7";
const GPU_B: &str = "GPU-a230e637-c9e1-1b61-3830-a437b874d88d";

fn machine() -> HardwareIdentity {
    HardwareIdentity {
        product_uuid: Some(UUID.to_owned()),
        serial_number: Some(SERIAL.to_owned()),
        permanent_macs: vec![MAC_A.to_owned(), MAC_B.to_owned()],
        gpu_uuids: vec![GPU_A.to_owned(), GPU_B.to_owned()],
    }
}

fn only_serial(serial: &str) -> HardwareIdentity {
    HardwareIdentity { serial_number: Some(serial.to_owned()), ..HardwareIdentity::default() }
}

fn only_uuid(uuid: &str) -> HardwareIdentity {
    HardwareIdentity { product_uuid: Some(uuid.to_owned()), ..HardwareIdentity::default() }
}

fn only_mac(mac: &str) -> HardwareIdentity {
    HardwareIdentity { permanent_macs: vec![mac.to_owned()], ..HardwareIdentity::default() }
}

fn assert_dropped(identity: &HardwareIdentity) {
    let key = hardware_key(identity);
    assert!(key.surviving.is_empty(), "{identity:?} should leave nothing, left {:?}", key.surviving);
    assert_eq!(key.key, hardware_key(&HardwareIdentity::default()).key);
    assert!(!key.trusted);
}

#[test]
fn key_is_64_lower_case_hex_characters() {
    let key = hardware_key(&machine()).key;
    assert_eq!(key.len(), 64);
    assert!(key.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)), "{key}");
}

#[test]
fn key_is_sha256_of_the_labelled_text() {
    let text = format!(
        "product_uuid={UUID}\nserial_number={}\nmacs={MAC_A},{MAC_B}\ngpu_uuids={},{}\n",
        SERIAL.to_lowercase(),
        GPU_A.to_lowercase(),
        GPU_B.to_lowercase()
    );
    assert_eq!(hardware_key(&machine()).key, to_hex(&Sha256::digest(text.as_bytes())));
}

#[test]
fn key_is_stable_under_reordering_macs_and_gpu_uuids() {
    let mut reordered = machine();
    reordered.permanent_macs.reverse();
    reordered.gpu_uuids.reverse();
    assert_eq!(hardware_key(&reordered), hardware_key(&machine()));
}

#[test]
fn key_is_stable_under_case_and_whitespace() {
    let shouted = HardwareIdentity {
        product_uuid: Some(format!("  {}\n", UUID.to_uppercase())),
        serial_number: Some(format!("\t{}  ", SERIAL.to_lowercase())),
        permanent_macs: vec![format!(" {} ", MAC_B.to_uppercase()), MAC_A.to_uppercase()],
        gpu_uuids: vec![GPU_B.to_uppercase(), format!("{GPU_A}  ")],
    };
    assert_eq!(hardware_key(&shouted), hardware_key(&machine()));
}

#[test]
fn key_is_stable_under_mac_notation_and_duplicates() {
    let mut written_otherwise = machine();
    written_otherwise.permanent_macs =
        vec!["3C-EC-EF-12-34-57".to_owned(), "3cecef123456".to_owned(), "3cec.ef12.3456".to_owned()];
    assert_eq!(hardware_key(&written_otherwise), hardware_key(&machine()));
}

#[test]
fn key_changes_when_an_identifier_changes() {
    let mut other = machine();
    other.serial_number = Some("CZ2D1234XZ".to_owned());
    assert_ne!(hardware_key(&other).key, hardware_key(&machine()).key);
}

#[test]
fn a_value_cannot_move_between_fields_without_changing_the_key() {
    let as_serial = only_serial(UUID);
    let as_uuid = only_uuid(UUID);
    assert_ne!(hardware_key(&as_serial).key, hardware_key(&as_uuid).key);
}

#[test]
fn missing_and_empty_values_are_dropped() {
    assert_dropped(&HardwareIdentity::default());
    assert_dropped(&only_serial(""));
    assert_dropped(&only_serial("   \t"));
    assert_dropped(&only_mac(""));
}

#[test]
fn all_zero_values_are_dropped() {
    assert_dropped(&only_uuid("00000000-0000-0000-0000-000000000000"));
    assert_dropped(&only_serial("0"));
    assert_dropped(&only_serial("0000000000"));
    assert_dropped(&only_mac("00:00:00:00:00:00"));
    assert_dropped(&only_mac("000000000000"));
    assert_dropped(&HardwareIdentity {
        gpu_uuids: vec!["GPU-00000000-0000-0000-0000-000000000000".to_owned()],
        ..HardwareIdentity::default()
    });
}

#[test]
fn all_f_values_are_dropped() {
    assert_dropped(&only_uuid("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"));
    assert_dropped(&only_mac("ff:ff:ff:ff:ff:ff"));
    assert_dropped(&only_mac("FF-FF-FF-FF-FF-FF"));
    assert_dropped(&only_serial("ffff"));
}

#[test]
fn vendor_filler_strings_are_dropped() {
    for filler in [
        "To Be Filled By O.E.M.",
        "To be filled by O.E.M",
        "Default string",
        "System Serial Number",
        "System Product Name",
        "Chassis Serial Number",
        "Not Specified",
        "Not Applicable",
    ] {
        assert_dropped(&only_serial(filler));
        assert_dropped(&only_uuid(&format!("  {}  ", filler.to_uppercase())));
    }
}

#[test]
fn unknown_none_and_invalid_markers_are_dropped() {
    for marker in ["None", "N/A", "Unknown", "INVALID", "null"] {
        assert_dropped(&only_serial(marker));
    }
}

#[test]
fn ascending_digit_runs_are_dropped() {
    for run in ["0123456789", "123456789", "1234567890", "12345678", "1234"] {
        assert_dropped(&only_serial(run));
    }
    // Digits that are not one consecutive run are a real serial.
    assert_eq!(hardware_key(&only_serial("1357")).surviving, vec![Identifier::SerialNumber("1357".to_owned())]);
    assert_eq!(hardware_key(&only_serial("12346")).surviving.len(), 1);
}

#[test]
fn one_repeated_character_is_dropped() {
    assert_dropped(&only_serial("XXXXXXXXXX"));
    assert_dropped(&only_serial("1111111111"));
}

#[test]
fn real_values_survive_normalized() {
    let key = hardware_key(&machine());
    assert_eq!(
        key.surviving,
        vec![
            Identifier::ProductUuid(UUID.to_owned()),
            Identifier::SerialNumber(SERIAL.to_lowercase()),
            Identifier::Mac(MAC_A.to_owned()),
            Identifier::Mac(MAC_B.to_owned()),
            Identifier::GpuUuid(GPU_A.to_lowercase()),
            Identifier::GpuUuid(GPU_B.to_lowercase()),
        ]
    );
}

#[test]
fn an_unusual_mac_is_kept_as_written() {
    let infiniband = "80:00:02:08:FE:80:00:00:00:00:00:00:0C:42:A1:03:00:5B:3C:D8";
    let key = hardware_key(&only_mac(infiniband));
    assert_eq!(key.surviving, vec![Identifier::Mac(infiniband.to_lowercase())]);
}

#[test]
fn trusted_needs_two_identifier_kinds() {
    assert!(hardware_key(&machine()).trusted);
    assert!(!hardware_key(&only_serial(SERIAL)).trusted);

    // Many MACs are still one kind.
    let macs_only =
        HardwareIdentity { permanent_macs: vec![MAC_A.to_owned(), MAC_B.to_owned()], ..HardwareIdentity::default() };
    assert!(!hardware_key(&macs_only).trusted);

    // A placeholder does not count as a kind.
    let with_filler = HardwareIdentity {
        product_uuid: Some("00000000-0000-0000-0000-000000000000".to_owned()),
        serial_number: Some("To Be Filled By O.E.M.".to_owned()),
        ..macs_only.clone()
    };
    assert!(!hardware_key(&with_filler).trusted);

    let mac_and_gpu = HardwareIdentity { gpu_uuids: vec![GPU_A.to_owned()], ..macs_only };
    assert!(hardware_key(&mac_and_gpu).trusted);
    let uuid_and_serial = HardwareIdentity { serial_number: Some(SERIAL.to_owned()), ..only_uuid(UUID) };
    assert!(hardware_key(&uuid_and_serial).trusted);
}

#[test]
fn a_machine_whose_gpus_were_all_swapped_still_matches() {
    let stored = hardware_key(&machine());
    let mut swapped = machine();
    swapped.gpu_uuids = vec![
        "GPU-11111111-2222-3333-4444-555555555555".to_owned(),
        "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa".to_owned(),
    ];
    swapped.permanent_macs = vec!["0c:42:a1:00:00:01".to_owned()];
    let seen = hardware_key(&swapped);
    assert_ne!(seen.key, stored.key);
    assert_eq!(matching_identifiers(&stored.surviving, &seen.surviving), 2);
    assert!(is_same_machine(&stored.surviving, &seen.surviving));
}

#[test]
fn a_different_machine_does_not_match() {
    let stored = hardware_key(&machine());
    let other = hardware_key(&HardwareIdentity {
        product_uuid: Some("4c4c4544-0047-3610-8052-b3c04f4d4e99".to_owned()),
        serial_number: Some("CZ2D9999AB".to_owned()),
        permanent_macs: vec!["3c:ec:ef:99:00:01".to_owned()],
        gpu_uuids: vec!["GPU-0badc0de-809d-de71-575c-e605602c71f7".to_owned()],
    });
    assert_eq!(matching_identifiers(&stored.surviving, &other.surviving), 0);
    assert!(!is_same_machine(&stored.surviving, &other.surviving));
}

#[test]
fn one_shared_identifier_is_not_enough() {
    let stored = hardware_key(&machine());
    let moved_nic = hardware_key(&HardwareIdentity {
        serial_number: Some("CZ2D9999AB".to_owned()),
        permanent_macs: vec![MAC_A.to_owned()],
        ..HardwareIdentity::default()
    });
    assert_eq!(matching_identifiers(&stored.surviving, &moved_nic.surviving), 1);
    assert!(!is_same_machine(&stored.surviving, &moved_nic.surviving));
}

#[test]
fn matching_counts_each_identifier_once() {
    let a = [Identifier::Mac(MAC_A.to_owned()), Identifier::Mac(MAC_A.to_owned())];
    let b = [Identifier::Mac(MAC_A.to_owned())];
    assert_eq!(matching_identifiers(&a, &b), 1);
    assert!(!is_same_machine(&a, &b));
    // The same text under another kind is another identifier.
    let c = [Identifier::SerialNumber(MAC_A.to_owned())];
    assert_eq!(matching_identifiers(&b, &c), 0);
}

#[test]
fn identity_and_identifiers_use_camel_case_on_the_wire() {
    let identity = machine();
    let bytes = rmp_serde::to_vec_named(&identity).expect("encode");
    let value: rmpv::Value = rmp_serde::from_slice(&bytes).expect("value");
    let keys: Vec<&str> = value.as_map().expect("a map").iter().filter_map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["productUuid", "serialNumber", "permanentMacs", "gpuUuids"]);

    let key = hardware_key(&identity);
    let bytes = rmp_serde::to_vec_named(&key).expect("encode");
    assert_eq!(rmp_serde::from_slice::<HardwareKey>(&bytes).expect("decode"), key);
    let bytes = rmp_serde::to_vec_named(&Identifier::GpuUuid("gpu-1".to_owned())).expect("encode");
    let value: rmpv::Value = rmp_serde::from_slice(&bytes).expect("value");
    let map = value.as_map().expect("a map");
    assert_eq!(map[0].0.as_str(), Some("kind"));
    assert_eq!(map[0].1.as_str(), Some("gpuUuid"));
    assert_eq!(map[1].1.as_str(), Some("gpu-1"));
}
