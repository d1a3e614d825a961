//! Tests of `id`.

use super::*;

#[test]
fn ids_carry_prefix_and_lower_case_ulid() {
    let id = new_id("site");
    let body = id.strip_prefix("site_").expect("prefix");
    assert_eq!(body.len(), 26);
    assert!(body.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()));
    assert!(!body.contains(['i', 'l', 'o', 'u']));
    assert_eq!(SiteId::generate().as_str().len(), 31);
}

#[test]
fn ids_made_in_a_burst_sort_in_creation_order() {
    let ids: Vec<String> = (0..10_000).map(|_| new_id("evt")).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    let pools: Vec<PoolId> = (0..100).map(|_| PoolId::generate()).collect();
    assert!(pools.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn generated_ids_parse_back_and_refuse_other_kinds() {
    let pool = PoolId::generate();
    assert_eq!(pool.as_str().parse::<PoolId>().expect("parse"), pool);
    let err = pool.as_str().parse::<NodeId>().expect_err("a pool id is not a node id");
    assert_eq!(err.kind, "node id");
    assert!(err.to_string().contains("node_"), "{err}");
    for bad in [
        "pool_",
        "pool_01JD8W2K3M4N5P6Q7R8S9T0V1W",
        "pool_01jd8w2k3m4n5p6q7r8s9t0v1",
        "pool_01jd8w2k3m4n5p6q7r8s9t0v1i",
    ] {
        assert!(bad.parse::<PoolId>().is_err(), "{bad}");
    }
}

#[test]
fn an_id_body_takes_exactly_the_lower_case_crockford_letters_whatever_the_byte() {
    let pool = PoolId::generate();
    let reservation = ReservationId::derive(&"acme".parse().expect("tenant"), &"a@acme".parse().expect("id"), "k");
    for byte in 0..=u8::MAX {
        let letter = [byte];
        let Ok(letter) = std::str::from_utf8(&letter) else { continue };
        let allowed = "0123456789abcdefghjkmnpqrstvwxyz".contains(letter);
        // The letter in the last place of the body, where an id's own letters would hide a miss elsewhere.
        let pool_like = format!("{}{letter}", &pool.as_str()[..pool.as_str().len() - 1]);
        let reservation_like = format!("{}{letter}", &reservation.as_str()[..reservation.as_str().len() - 1]);
        assert_eq!(pool_like.parse::<PoolId>().is_ok(), allowed, "{pool_like:?}");
        assert_eq!(reservation_like.parse::<ReservationId>().is_ok(), allowed, "{reservation_like:?}");
    }
    // A two-byte character in the last two places keeps the length and is refused: both its bytes are above ASCII.
    let wide = format!("{}é", &pool.as_str()[..pool.as_str().len() - 2]);
    assert_eq!(wide.len(), pool.as_str().len());
    assert!(wide.parse::<PoolId>().is_err(), "{wide:?}");
}

#[test]
fn reservation_ids_derive_from_tenant_identity_and_key() {
    let tenant: TenantId = "acme".parse().expect("tenant");
    let other: TenantId = "globex".parse().expect("tenant");
    let alice: Identity = "alice@acme".parse().expect("identity");
    let a = ReservationId::derive(&tenant, &alice, "key-1");
    assert_eq!(a, ReservationId::derive(&tenant, &alice, "key-1"), "same inputs, same id");
    assert_ne!(a, ReservationId::derive(&other, &alice, "key-1"), "another tenant, another id");
    assert_ne!(a, ReservationId::derive(&tenant, &alice, "key-2"));
    assert_eq!(a.as_str().len(), 4 + 52);
    assert_eq!(a.as_str().parse::<ReservationId>().expect("parse"), a);
    // The separator keeps ("ab", "c") apart from ("a", "bc").
    let ab: TenantId = "ab".parse().expect("tenant");
    let a_only: TenantId = "a".parse().expect("tenant");
    let c: Identity = "c".parse().expect("identity");
    let bc: Identity = "bc".parse().expect("identity");
    assert_ne!(ReservationId::derive(&ab, &c, "k"), ReservationId::derive(&a_only, &bc, "k"));
}

#[test]
fn crockford_base32_matches_known_values() {
    assert_eq!(crockford_base32(&[]), "");
    assert_eq!(crockford_base32(&[0xff]), "zw");
    assert_eq!(crockford_base32(&[0, 0, 0, 0, 0]), "00000000");
    assert_eq!(crockford_base32(&[0x08, 0x42, 0x10, 0x84, 0x21]), "11111111");
}

#[test]
fn external_ids_check_length_and_characters() {
    assert!("root".parse::<TenantId>().is_ok());
    assert!("".parse::<TenantId>().is_err());
    assert!("has space".parse::<TenantId>().is_err());
    assert!("x".repeat(129).parse::<TenantId>().is_err());
    assert!("GPU-5b1d9c2e-8f3a-4b6c-9d0e-1f2a3b4c5d6e/gi1/ci0".parse::<DeviceId>().is_ok());
    let gpu: DeviceId = "GPU-1".parse().expect("device");
    assert_eq!(DeviceId::mig(&gpu, 2, 0).as_str(), "GPU-1/gi2/ci0");
    assert_eq!(DeviceId::slot(&gpu, 3).as_str(), "GPU-1/s3");
}
