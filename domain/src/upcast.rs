//! The upcasters of this build: each step turns a released payload shape into the next version's. Released
//! event types and versions never change; a new shape gets a new version and a step here.

use std::sync::OnceLock;

use rmpv::Value;

use crate::event::Upcasters;

/// Every upcaster of the domain's events.
pub fn registry() -> &'static Upcasters {
    static REGISTRY: OnceLock<Upcasters> = OnceLock::new();
    REGISTRY.get_or_init(|| Upcasters::new().register("site.created", 1, site_created_v1_to_v2))
}

/// `site.created` v1 named the region `region`; v2 names it `iamRegion`, after Better IAM's grammar it follows.
fn site_created_v1_to_v2(value: Value) -> Result<Value, String> {
    let Value::Map(entries) = value else { return Err("site.created v1 is not a map".to_owned()) };
    Ok(Value::Map(
        entries
            .into_iter()
            .map(
                |(key, value)| {
                    if key.as_str() == Some("region") { (Value::from("iamRegion"), value) } else { (key, value) }
                },
            )
            .collect(),
    ))
}

#[cfg(test)]
mod tests {

    use crate::event::DomainEvent;
    use crate::site::SiteEvent;

    #[test]
    fn a_version_1_site_created_decodes_through_its_upcaster() {
        let v1 = rmp_serde::to_vec_named(&serde_json::json!({
            "siteId": "site_01jd8w2k3m4n5p6q7r8s9t0v1w",
            "ownerTenantId": "root",
            "name": "fra1",
            "region": "eu-central-1",
            "kind": "shared",
            "atMs": 0,
        }))
        .expect("encode");
        let SiteEvent::Created(site) = SiteEvent::decode("site.created", 1, &v1).expect("decode v1") else {
            panic!("site.created decodes as a creation");
        };
        assert_eq!(site.iam_region.as_str(), "eu-central-1");
        assert_eq!(SiteEvent::Created(site).schema_version(), 2);
    }
}
