//! Fleet as code: `better-compute fleet export | plan | apply` over one YAML document of the caller's sites,
//! pools (with their policies, offers and quotas) and profiles, through the API.
//!
//! A document names things, never ids: a pool's site by its name, an offer by its tenant. `plan` compares the
//! document with the live fleet and prints what `apply` would do; `apply` does it, each create with an
//! idempotency key derived from the plan (the live state and the document), so an apply cut off half-way and run
//! again creates nothing twice; applying the same document twice changes nothing the second time.
//!
//! What a document leaves out keeps its live value (a policy field, a step's timeout), as `kubectl apply` does
//! for fields it never set; things of the fleet the document does not name are kept and listed, and removed
//! only with `--prune`. A site's region and kind, and a pool's site, class and GPU model cannot change: a plan
//! that needs it fails, naming the field.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context as _, bail};
use bc_client::{Client, encode};
use bc_domain::pool::{PoolAgent, PoolClass, Sharing};
use bc_wire::fleet::{OfferBody, PoolBody, PoolDto, PoolPolicyDto, SiteBody, SiteDto};
use bc_wire::profiles::{ProfileBody, ProfileDto};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The document's version tag.
pub const API_VERSION: &str = "better-compute/v1";

/// The whole document.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetDocument {
    pub api_version: String,
    #[serde(default)]
    pub sites: Vec<SiteBody>,
    #[serde(default)]
    pub pools: Vec<PoolSpec>,
    #[serde(default)]
    pub profiles: Vec<ProfileBody>,
}

/// A pool as the document describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    pub name: String,
    /// The site's name.
    pub site: String,
    pub class: PoolClass,
    pub gpu_model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<PoolAgent>,
    /// The policy's fields the document sets (a `PoolPolicyDto`); the others keep their live value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_account_id: Option<String>,
    #[serde(default)]
    pub offers: Vec<OfferBody>,
}

impl FleetDocument {
    /// Reads a document (YAML, or JSON, which is YAML too), checking what the types alone cannot.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let document: FleetDocument = yaml_serde::from_str(text).context("the fleet document")?;
        if document.api_version != API_VERSION {
            bail!("apiVersion is {:?}; this build reads {API_VERSION:?}", document.api_version);
        }
        let mut names = BTreeMap::new();
        for (kind, name) in document
            .sites
            .iter()
            .map(|s| ("site", &s.name))
            .chain(document.pools.iter().map(|p| ("pool", &p.name)))
            .chain(document.profiles.iter().map(|p| ("profile", &p.name)))
        {
            if names.insert((kind, name.clone()), ()).is_some() {
                bail!("the document names {kind} {name:?} twice");
            }
        }
        for pool in &document.pools {
            if let Some(policy) = &pool.policy {
                serde_json::from_value::<PoolPolicyDto>(policy.clone())
                    .with_context(|| format!("pools[{}].policy", pool.name))?;
            }
            let mut tenants = BTreeMap::new();
            for offer in &pool.offers {
                if tenants.insert(offer.tenant_id.clone(), ()).is_some() {
                    bail!("pool {:?} offers itself to {:?} twice", pool.name, offer.tenant_id);
                }
            }
        }
        Ok(document)
    }
}

/// What the caller owns now.
struct Live {
    tenant: String,
    sites: Vec<SiteDto>,
    pools: Vec<PoolDto>,
    /// The latest version of each profile, by name.
    profiles: BTreeMap<String, ProfileDto>,
}

async fn live(client: &Client) -> anyhow::Result<Live> {
    let me = client.whoami().await?;
    let sites: Vec<SiteDto> = client.sites().await?.into_iter().filter(|s| s.owner_tenant_id == me.tenant_id).collect();
    let pools: Vec<PoolDto> = client.pools().await?.into_iter().filter(|p| p.owner_tenant_id == me.tenant_id).collect();
    let mut profiles: BTreeMap<String, ProfileDto> = BTreeMap::new();
    for profile in client.all::<ProfileDto>("/v1/profiles").await? {
        if profile.tenant_id != me.tenant_id {
            continue;
        }
        match profiles.get(&profile.name) {
            Some(kept) if kept.version >= profile.version => {}
            _ => {
                profiles.insert(profile.name.clone(), profile);
            }
        }
    }
    Ok(Live { tenant: me.tenant_id, sites, pools, profiles })
}

/// `fleet export`: the live fleet as a document that applies as no change.
pub async fn export(client: &Client) -> anyhow::Result<String> {
    let live = live(client).await?;
    let site_names: BTreeMap<&str, &str> = live.sites.iter().map(|s| (s.id.as_str(), s.name.as_str())).collect();
    let mut document = FleetDocument {
        api_version: API_VERSION.to_owned(),
        sites: Vec::new(),
        pools: Vec::new(),
        profiles: Vec::new(),
    };
    for site in &live.sites {
        document.sites.push(serde_json::from_value(serde_json::json!({
            "name": site.name, "iamRegion": site.iam_region, "kind": site.kind,
        }))?);
    }
    for pool in &live.pools {
        let offers = pool
            .offers
            .iter()
            .map(|o| OfferBody {
                tenant_id: o.tenant_id.clone(),
                quota: o.quota.clone(),
                priority: o.priority,
                include_descendants: o.include_descendants,
            })
            .collect();
        document.pools.push(PoolSpec {
            name: pool.name.clone(),
            site: site_names.get(pool.site_id.as_str()).map_or_else(|| pool.site_id.clone(), |n| (*n).to_owned()),
            class: serde_json::from_value(Value::String(pool.class.clone())).context("a pool's class")?,
            gpu_model: pool.gpu_model.clone(),
            sharing: Some(serde_json::from_value(Value::String(pool.sharing.clone())).context("a pool's sharing")?),
            agent: Some(serde_json::from_value(Value::String(pool.agent.clone())).context("a pool's agent")?),
            policy: Some(serde_json::to_value(&pool.policy)?),
            provider_account_id: None,
            offers,
        });
    }
    for profile in live.profiles.values() {
        document.profiles.push(serde_json::from_value(profile_as_body(profile))?);
    }
    Ok(yaml_serde::to_string(&document)?)
}

/// A profile version as the body that would make it.
fn profile_as_body(profile: &ProfileDto) -> Value {
    let mut value = serde_json::to_value(profile).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        for key in ["id", "tenantId", "version", "createdAt"] {
            map.remove(key);
        }
    }
    value
}

/// One change of a plan.
#[derive(Debug, Clone)]
enum Change {
    CreateSite(SiteBody),
    CreatePool { spec: PoolSpec },
    UpdatePool { id: String, name: String, body: Value, what: Vec<String> },
    Offer { pool: String, body: OfferBody, was: Option<String> },
    Revoke { pool_id: String, pool: String, tenant: String },
    DeletePool { id: String, name: String },
    DeleteSite { id: String, name: String },
    Profile { body: ProfileBody, after: Option<u32> },
}

impl Change {
    fn line(&self) -> String {
        match self {
            Change::CreateSite(site) => {
                format!("+ site {} (region {}, {})", site.name, site.iam_region, json(&site.kind))
            }
            Change::CreatePool { spec } => format!(
                "+ pool {} (site {}, {}, {}, {})",
                spec.name,
                spec.site,
                json(&spec.class),
                spec.gpu_model,
                spec.sharing.map_or_else(|| "exclusive".to_owned(), |s| json(&s))
            ),
            Change::UpdatePool { name, what, .. } => format!("~ pool {name}: {}", what.join("; ")),
            Change::Offer { pool, body, was: None } => {
                format!("+ offer of pool {pool} to {}: quota {}", body.tenant_id, json(&body.quota))
            }
            Change::Offer { pool, body, was: Some(was) } => format!(
                "~ offer of pool {pool} to {}: {was} → quota {}, priority {}, includeDescendants {}",
                body.tenant_id,
                json(&body.quota),
                body.priority,
                body.include_descendants
            ),
            Change::Revoke { pool, tenant, .. } => format!("- offer of pool {pool} to {tenant}"),
            Change::DeletePool { name, .. } => format!("- pool {name}"),
            Change::DeleteSite { name, .. } => format!("- site {name}"),
            Change::Profile { body, after: None } => format!("+ profile {} (version 1)", body.name),
            Change::Profile { body, after: Some(version) } => {
                format!("~ profile {}: a new version after version {version}", body.name)
            }
        }
    }
}

fn json<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

/// What `apply` would do, what it keeps, and the key its creates are made idempotent with.
pub struct Plan {
    changes: Vec<Change>,
    kept: Vec<String>,
    key: String,
    /// The ids of the live sites and pools, by name, as the plan read them.
    site_ids: BTreeMap<String, String>,
    pool_ids: BTreeMap<String, String>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The plan as people read it.
    pub fn text(&self, prune: bool) -> String {
        let mut text = String::new();
        for change in &self.changes {
            let _ = writeln!(text, "{}", change.line());
        }
        for kept in &self.kept {
            let _ = writeln!(text, "  {kept} (not in the document: kept; --prune removes it)");
        }
        let count = |sign: char| self.changes.iter().filter(|c| c.line().starts_with(sign)).count();
        if self.changes.is_empty() {
            text.push_str("No changes: the fleet is as the document says.\n");
        } else {
            let _ = writeln!(
                text,
                "Plan: {} to add, {} to change, {} to remove{}.",
                count('+'),
                count('~'),
                count('-'),
                if prune { "" } else { " (without --prune nothing is removed but offers the document changes)" }
            );
        }
        text
    }
}

/// Whether `live` already holds everything `want` sets: objects key by key (a key `want` leaves out, or sets
/// to null, is anything), lists element by element, numbers by value.
pub fn covers(live: &Value, want: &Value) -> bool {
    match (want, live) {
        (Value::Null, _) => true,
        (Value::Object(want), Value::Object(live)) => {
            want.iter().all(|(key, want)| covers(live.get(key).unwrap_or(&Value::Null), want))
        }
        (Value::Array(want), Value::Array(live)) => {
            want.len() == live.len() && want.iter().zip(live).all(|(want, live)| covers(live, want))
        }
        (Value::Number(want), Value::Number(live)) => want.as_f64() == live.as_f64(),
        (want, live) => want == live,
    }
}

/// `base` with what `over` sets laid over it (objects merged key by key, anything else replaced).
pub fn overlay(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (_, Value::Null) => base.clone(),
        (Value::Object(base), Value::Object(over)) => {
            let mut merged = base.clone();
            for (key, value) in over {
                let next = overlay(base.get(key).unwrap_or(&Value::Null), value);
                merged.insert(key.clone(), next);
            }
            Value::Object(merged)
        }
        (_, over) => over.clone(),
    }
}

/// Compares `document` with the live fleet.
pub async fn plan(client: &Client, document: &FleetDocument, prune: bool) -> anyhow::Result<Plan> {
    let live = live(client).await?;
    let mut changes = Vec::new();
    let mut kept = Vec::new();
    let mut refused = Vec::new();

    let live_sites: BTreeMap<&str, &SiteDto> = live.sites.iter().map(|s| (s.name.as_str(), s)).collect();
    let site_names: BTreeMap<&str, &str> = live.sites.iter().map(|s| (s.id.as_str(), s.name.as_str())).collect();
    for site in &document.sites {
        match live_sites.get(site.name.as_str()) {
            None => changes.push(Change::CreateSite(site.clone())),
            Some(now) => {
                if now.iam_region != site.iam_region {
                    refused.push(format!(
                        "site {}: iamRegion cannot change ({} → {})",
                        site.name, now.iam_region, site.iam_region
                    ));
                }
                if now.kind != json(&site.kind) {
                    refused.push(format!(
                        "site {}: kind cannot change ({} → {})",
                        site.name,
                        now.kind,
                        json(&site.kind)
                    ));
                }
            }
        }
    }
    let named_sites: Vec<&str> = document.sites.iter().map(|s| s.name.as_str()).collect();

    let live_pools: BTreeMap<&str, &PoolDto> = live.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    for spec in &document.pools {
        if !live_sites.contains_key(spec.site.as_str()) && !named_sites.contains(&spec.site.as_str()) {
            refused.push(format!("pool {}: no site named {:?} (in the fleet or the document)", spec.name, spec.site));
            continue;
        }
        let Some(now) = live_pools.get(spec.name.as_str()) else {
            changes.push(Change::CreatePool { spec: spec.clone() });
            for offer in &spec.offers {
                changes.push(Change::Offer { pool: spec.name.clone(), body: offer.clone(), was: None });
            }
            continue;
        };
        let site_now = site_names.get(now.site_id.as_str()).copied().unwrap_or(now.site_id.as_str());
        for (field, was, want) in [
            ("site", site_now.to_owned(), spec.site.clone()),
            ("class", now.class.clone(), json(&spec.class)),
            ("gpuModel", now.gpu_model.clone(), spec.gpu_model.clone()),
        ] {
            if was != want {
                refused.push(format!("pool {}: {field} cannot change ({was} → {want}); make a new pool", spec.name));
            }
        }
        if let Some(agent) = spec.agent
            && json(&agent) != now.agent
        {
            refused.push(format!("pool {}: agent cannot change ({} → {})", spec.name, now.agent, json(&agent)));
        }
        let mut body = serde_json::Map::new();
        let mut what = Vec::new();
        if let Some(sharing) = spec.sharing
            && json(&sharing) != now.sharing
        {
            what.push(format!("sharing {} → {}", now.sharing, json(&sharing)));
            body.insert("sharing".into(), serde_json::to_value(sharing)?);
        }
        if let Some(want) = &spec.policy {
            let live_policy = serde_json::to_value(&now.policy)?;
            if !covers(&live_policy, want) {
                if let (Value::Object(want_fields), Value::Object(live_fields)) = (want, &live_policy) {
                    for (key, value) in want_fields {
                        let was = live_fields.get(key).unwrap_or(&Value::Null);
                        if !covers(was, value) {
                            what.push(format!("policy.{key} {was} → {value}"));
                        }
                    }
                }
                body.insert("policy".into(), overlay(&live_policy, want));
            }
        }
        if !what.is_empty() {
            changes.push(Change::UpdatePool {
                id: now.id.clone(),
                name: spec.name.clone(),
                body: Value::Object(body),
                what,
            });
        }
        for offer in &spec.offers {
            match now.offers.iter().find(|o| o.tenant_id == offer.tenant_id) {
                None => changes.push(Change::Offer { pool: spec.name.clone(), body: offer.clone(), was: None }),
                Some(o) => {
                    let same = serde_json::to_value(&o.quota)? == serde_json::to_value(&offer.quota)?
                        && o.priority == offer.priority
                        && o.include_descendants == offer.include_descendants;
                    if !same {
                        let was = format!(
                            "quota {}, priority {}, includeDescendants {}",
                            json(&o.quota),
                            o.priority,
                            o.include_descendants
                        );
                        changes.push(Change::Offer { pool: spec.name.clone(), body: offer.clone(), was: Some(was) });
                    }
                }
            }
        }
        for o in &now.offers {
            if !spec.offers.iter().any(|offer| offer.tenant_id == o.tenant_id) {
                if prune {
                    changes.push(Change::Revoke {
                        pool_id: now.id.clone(),
                        pool: spec.name.clone(),
                        tenant: o.tenant_id.clone(),
                    });
                } else {
                    kept.push(format!("offer of pool {} to {}", spec.name, o.tenant_id));
                }
            }
        }
    }
    let named_pools: Vec<&str> = document.pools.iter().map(|p| p.name.as_str()).collect();
    for pool in &live.pools {
        if !named_pools.contains(&pool.name.as_str()) {
            if prune {
                changes.push(Change::DeletePool { id: pool.id.clone(), name: pool.name.clone() });
            } else {
                kept.push(format!("pool {}", pool.name));
            }
        }
    }
    for site in &live.sites {
        if !named_sites.contains(&site.name.as_str()) {
            if prune {
                changes.push(Change::DeleteSite { id: site.id.clone(), name: site.name.clone() });
            } else {
                kept.push(format!("site {}", site.name));
            }
        }
    }
    for profile in &document.profiles {
        let want = serde_json::to_value(profile)?;
        match live.profiles.get(&profile.name) {
            None => changes.push(Change::Profile { body: profile.clone(), after: None }),
            Some(now) if !covers(&profile_as_body(now), &want) => {
                changes.push(Change::Profile { body: profile.clone(), after: Some(now.version) });
            }
            Some(_) => {}
        }
    }
    if !refused.is_empty() {
        bail!("the document cannot be applied: {}", refused.join("; "));
    }
    // The creates' idempotency keys come from the live state and the document: the same plan run again (an
    // apply cut off half-way) makes the same keys, a later one new keys.
    let mut hash = Sha256::new();
    hash.update(live.tenant.as_bytes());
    hash.update(serde_json::to_vec(&(&live.sites, &live.pools, &live.profiles))?);
    hash.update(serde_json::to_vec(document)?);
    let key = format!("fleet-{}", &hex::encode(hash.finalize())[..32]);
    let site_ids = live.sites.iter().map(|s| (s.name.clone(), s.id.clone())).collect();
    let pool_ids = live.pools.iter().map(|p| (p.name.clone(), p.id.clone())).collect();
    Ok(Plan { changes, kept, key, site_ids, pool_ids })
}

/// Does what `plan` says, in order: sites, pools, pools' changes, offers, profiles, then what `--prune`
/// removes (offers, pools, sites). Prints each change as it is made.
pub async fn apply(client: &Client, plan: &Plan) -> anyhow::Result<()> {
    let (mut site_ids, mut pool_ids) = (plan.site_ids.clone(), plan.pool_ids.clone());
    let key = |what: &str| format!("{}-{}", plan.key, &hex::encode(Sha256::digest(what.as_bytes()))[..16]);
    for change in &plan.changes {
        match change {
            Change::CreateSite(site) => {
                let made: bc_wire::CreatedDto =
                    client.send(Method::POST, "/v1/sites", site, Some(&key(&format!("site/{}", site.name)))).await?;
                site_ids.insert(site.name.clone(), made.id);
            }
            Change::CreatePool { spec } => {
                let Some(site_id) = site_ids.get(&spec.site) else {
                    bail!("pool {}: its site {:?} was not made", spec.name, spec.site);
                };
                let policy = match &spec.policy {
                    Some(policy) => serde_json::from_value(policy.clone()).context("the pool's policy")?,
                    None => PoolPolicyDto::default(),
                };
                let body = PoolBody {
                    site_id: site_id.clone(),
                    name: spec.name.clone(),
                    class: spec.class,
                    gpu_model: spec.gpu_model.clone(),
                    sharing: spec.sharing.unwrap_or_default(),
                    agent: spec.agent.unwrap_or_default(),
                    policy,
                    provider_account_id: spec.provider_account_id.clone(),
                };
                let made: bc_wire::CreatedDto =
                    client.send(Method::POST, "/v1/pools", &body, Some(&key(&format!("pool/{}", spec.name)))).await?;
                pool_ids.insert(spec.name.clone(), made.id);
            }
            Change::UpdatePool { id, body, .. } => {
                let _: Value = client.send(Method::PATCH, &format!("/v1/pools/{}", encode(id)), body, None).await?;
            }
            Change::Offer { pool, body, .. } => {
                let Some(pool_id) = pool_ids.get(pool) else { bail!("pool {pool} was not made") };
                let path = format!("/v1/pools/{}/offers", encode(pool_id));
                let _: Value = client.send(Method::POST, &path, body, None).await?;
            }
            Change::Profile { body, .. } => {
                let _: Value = client
                    .send(Method::POST, "/v1/profiles", body, Some(&key(&format!("profile/{}", body.name))))
                    .await?;
            }
            Change::Revoke { pool_id, tenant, .. } => {
                let path = format!("/v1/pools/{}/offers/{}", encode(pool_id), encode(tenant));
                let _: Value = client.call::<(), _>(Method::DELETE, &path, None).await?;
            }
            Change::DeletePool { id, .. } => {
                let _: Value = client.call::<(), _>(Method::DELETE, &format!("/v1/pools/{}", encode(id)), None).await?;
            }
            Change::DeleteSite { id, .. } => {
                let _: Value = client.call::<(), _>(Method::DELETE, &format!("/v1/sites/{}", encode(id)), None).await?;
            }
        }
        println!("{}", change.line());
    }
    // Answer once the read models show every change, so that the next command (a plan) sees them.
    for list in ["/v1/sites?limit=1", "/v1/pools?limit=1", "/v1/profiles?limit=1"] {
        let _: Value = client.get(list).await?;
    }
    Ok(())
}
