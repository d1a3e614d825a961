//! The node hardware key: normalized machine identifiers, the placeholder blocklist, the SHA-256 key and matching.
//!
//! A machine reports its product UUID, serial number, permanent MACs and GPU UUIDs. Firmware often fills these
//! with placeholders ("To Be Filled By O.E.M.", all zeros), which would make unrelated machines collide, so such
//! values are dropped before hashing. The key is trusted only when two identifier kinds survive, and the surviving
//! identifiers are kept one by one so that a machine that rejoins after a GPU or NIC swap is still recognised.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a machine reports about itself, as read from DMI, the NICs and NVML, before normalization.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareIdentity {
    pub product_uuid: Option<String>,
    pub serial_number: Option<String>,
    pub permanent_macs: Vec<String>,
    pub gpu_uuids: Vec<String>,
}

/// One normalized identifier that survived the placeholder blocklist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "camelCase")]
pub enum Identifier {
    ProductUuid(String),
    SerialNumber(String),
    Mac(String),
    GpuUuid(String),
}

impl Identifier {
    /// The kind's name and the value, as stored one by one.
    pub fn parts(&self) -> (&'static str, &str) {
        match self {
            Identifier::ProductUuid(v) => ("productUuid", v),
            Identifier::SerialNumber(v) => ("serialNumber", v),
            Identifier::Mac(v) => ("mac", v),
            Identifier::GpuUuid(v) => ("gpuUuid", v),
        }
    }
}

/// A machine's hardware key and the identifiers it was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareKey {
    /// Lower-case hex SHA-256 over the labelled, normalized identifiers.
    pub key: String,
    /// True when at least [`MIN_TRUSTED_KINDS`] identifier kinds survived the blocklist.
    pub trusted: bool,
    /// Every surviving identifier: the product UUID, the serial number, then the MACs and GPU UUIDs, sorted.
    pub surviving: Vec<Identifier>,
}

/// How many identifier kinds must survive for the key to be trusted (DESIGN.md section 10).
pub const MIN_TRUSTED_KINDS: usize = 2;

/// How many identifiers a stored machine and a newly seen one must share to be the same machine.
pub const MIN_MATCHING_IDENTIFIERS: usize = 2;

/// Values that firmware and drivers write when they have no real identifier, compared after trimming and
/// lower-casing. All zeros, all `f`, one repeated character and runs of consecutive digits are caught by rule in
/// [`is_placeholder`] instead, because they come in every length.
const PLACEHOLDERS: &[&str] = &[
    "to be filled by o.e.m.",
    "to be filled by o.e.m",
    "to be filled by oem",
    "default string",
    "default",
    "system serial number",
    "system product name",
    "system manufacturer",
    "system version",
    "system uuid",
    "chassis serial number",
    "base board serial number",
    "serial number",
    "not specified",
    "not applicable",
    "not available",
    "not present",
    "not set",
    "none",
    "n/a",
    "na",
    "null",
    "nil",
    "empty",
    "unknown",
    "invalid",
    "tbd",
    "oem",
    "o.e.m.",
    "0123456789",
    "123456789",
    "1234567890",
    "00000000-0000-0000-0000-000000000000",
];

/// A run of consecutive ascending digits this long or longer ("1234", "0123456789") is a placeholder.
const MIN_DIGIT_RUN: usize = 4;

/// A single character repeated this many times or more ("xxxxxxxx", "11111111") is a placeholder.
const MIN_REPEATED_RUN: usize = 4;

/// Computes the hardware key of a machine from what it reports.
pub fn hardware_key(identity: &HardwareIdentity) -> HardwareKey {
    let product_uuid = identity.product_uuid.as_deref().and_then(normalize_identifier);
    let serial_number = identity.serial_number.as_deref().and_then(normalize_identifier);
    let macs = normalize_all(&identity.permanent_macs, normalize_mac);
    let gpu_uuids = normalize_all(&identity.gpu_uuids, normalize_gpu_uuid);

    let mut text = String::new();
    text.push_str("product_uuid=");
    text.push_str(product_uuid.as_deref().unwrap_or(""));
    text.push_str("\nserial_number=");
    text.push_str(serial_number.as_deref().unwrap_or(""));
    text.push_str("\nmacs=");
    text.push_str(&macs.join(","));
    text.push_str("\ngpu_uuids=");
    text.push_str(&gpu_uuids.join(","));
    text.push('\n');
    let key = to_hex(&Sha256::digest(text.as_bytes()));

    let kinds = usize::from(product_uuid.is_some())
        + usize::from(serial_number.is_some())
        + usize::from(!macs.is_empty())
        + usize::from(!gpu_uuids.is_empty());

    let mut surviving = Vec::with_capacity(kinds + macs.len() + gpu_uuids.len());
    surviving.extend(product_uuid.map(Identifier::ProductUuid));
    surviving.extend(serial_number.map(Identifier::SerialNumber));
    surviving.extend(macs.into_iter().map(Identifier::Mac));
    surviving.extend(gpu_uuids.into_iter().map(Identifier::GpuUuid));

    HardwareKey { key, trusted: kinds >= MIN_TRUSTED_KINDS, surviving }
}

/// Counts the distinct identifiers present in both lists.
pub fn matching_identifiers(a: &[Identifier], b: &[Identifier]) -> usize {
    let a: BTreeSet<&Identifier> = a.iter().collect();
    let b: BTreeSet<&Identifier> = b.iter().collect();
    a.intersection(&b).count()
}

/// Whether a newly seen machine is a stored one: they share at least [`MIN_MATCHING_IDENTIFIERS`] identifiers.
pub fn is_same_machine(stored: &[Identifier], seen: &[Identifier]) -> bool {
    matching_identifiers(stored, seen) >= MIN_MATCHING_IDENTIFIERS
}

/// Normalizes each value, drops placeholders, then sorts and removes duplicates so that the order in which the
/// machine listed them, or a value it listed twice, does not change the key.
fn normalize_all(values: &[String], normalize: fn(&str) -> Option<String>) -> Vec<String> {
    let set: BTreeSet<String> = values.iter().filter_map(|value| normalize(value)).collect();
    set.into_iter().collect()
}

/// Trims and lower-cases a value; `None` when it is a placeholder.
fn normalize_identifier(raw: &str) -> Option<String> {
    let value = raw.trim().to_lowercase();
    (!is_placeholder(&value)).then_some(value)
}

/// Normalizes a MAC to `aa:bb:cc:dd:ee:ff`. Six octets written with `-`, `.` or no separators are rewritten;
/// anything else (an InfiniBand address, say) is kept trimmed and lower-cased.
fn normalize_mac(raw: &str) -> Option<String> {
    let value = raw.trim().to_lowercase();
    let digits: String = value.chars().filter(|c| !matches!(c, ':' | '-' | '.')).collect();
    let value = if digits.len() == 12 && digits.chars().all(|c| c.is_ascii_hexdigit()) {
        let octets: Vec<&str> = (0..12).step_by(2).map(|i| &digits[i..i + 2]).collect();
        octets.join(":")
    } else {
        value
    };
    (!is_placeholder(&value)).then_some(value)
}

/// Normalizes a GPU UUID; the `gpu-` prefix NVML puts in front is ignored when looking for a placeholder, so
/// that `GPU-00000000-0000-...` is dropped too.
fn normalize_gpu_uuid(raw: &str) -> Option<String> {
    let value = raw.trim().to_lowercase();
    let bare = value.strip_prefix("gpu-").unwrap_or(&value);
    (!is_placeholder(bare)).then_some(value)
}

/// Whether a trimmed, lower-cased value is a placeholder rather than a real identifier.
fn is_placeholder(value: &str) -> bool {
    if PLACEHOLDERS.contains(&value) {
        return true;
    }
    // Separators carry no identity, so "00:00:00:00:00:00" and "ffff-ffff" are judged by their digits.
    let core: Vec<char> = value.chars().filter(|c| !matches!(c, '-' | ':' | '.')).collect();
    let Some(&first) = core.first() else {
        return true;
    };
    if core.iter().all(|&c| c == '0') || core.iter().all(|&c| c == 'f') {
        return true;
    }
    if core.len() >= MIN_REPEATED_RUN && core.iter().all(|&c| c == first) {
        return true;
    }
    core.len() >= MIN_DIGIT_RUN
        && core.iter().all(char::is_ascii_digit)
        && core.windows(2).all(|pair| u32::from(pair[1]) == u32::from(pair[0]) + 1)
}

/// Lower-case hex of a byte string.
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

#[cfg(test)]
mod tests {
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
        let macs_only = HardwareIdentity {
            permanent_macs: vec![MAC_A.to_owned(), MAC_B.to_owned()],
            ..HardwareIdentity::default()
        };
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
}
