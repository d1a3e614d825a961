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
mod tests;
