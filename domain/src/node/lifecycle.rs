//! A node's lifecycle (`provisionState`, DESIGN section 10): machines that join with `bcd` go `adopting →
//! adopted`; machines enrolled from their BMC go `enrolling → inspecting → commissioning → ready → deploying →
//! deployed → releasing → ready`; any state but `retired` may go to `failed` or `rescue`; `ready`, `adopted` and
//! `deployed` retire through `retiring → retired`. A transitional state that lasts longer than its limit goes to
//! `failed`, naming the state it was stuck in. Every move is a `node.provision_changed` event; a move the table
//! does not allow is refused, naming the state the node is in and where it may go.

use std::collections::BTreeMap;

use super::{BmcDriver, Node, NodeBmc, NodeBmcSet, NodeEvent, NodeProvisionChanged, ProvisionState};
use crate::Rejection;
use crate::id::NodeId;
use crate::profile::{Concern, concerns_of};

use ProvisionState::*;

impl ProvisionState {
    pub fn as_str(self) -> &'static str {
        match self {
            Adopting => "adopting",
            Adopted => "adopted",
            Enrolling => "enrolling",
            Inspecting => "inspecting",
            Commissioning => "commissioning",
            Ready => "ready",
            Deploying => "deploying",
            Deployed => "deployed",
            Releasing => "releasing",
            Rescue => "rescue",
            Failed => "failed",
            Retiring => "retiring",
            Retired => "retired",
        }
    }

    /// Where a node in this state may go next (besides `failed` and `rescue`, open to every state but
    /// `retired`).
    pub fn next(self) -> &'static [ProvisionState] {
        match self {
            Adopting => &[Adopted],
            Adopted => &[Retiring],
            Enrolling => &[Inspecting],
            Inspecting => &[Commissioning],
            Commissioning => &[Ready],
            Ready => &[Deploying, Retiring],
            Deploying => &[Deployed],
            Deployed => &[Releasing, Retiring],
            Releasing => &[Ready],
            // Out of rescue: back to the deployed host, or wiped.
            Rescue => &[Deployed, Releasing],
            // Out of failure: inspected again, wiped, or retired.
            Failed => &[Inspecting, Releasing, Retiring],
            Retiring => &[Retired],
            Retired => &[],
        }
    }

    /// Whether a node in this state may be scheduled on (`adopted` or `deployed`; the other seven conditions
    /// of the rule apply too).
    pub fn schedulable(self) -> bool {
        matches!(self, Adopted | Deployed)
    }

    /// Whether a node in this state may move to `to`.
    pub fn may_go_to(self, to: ProvisionState) -> bool {
        self != to && (self.next().contains(&to) || (self != Retired && matches!(to, Failed | Rescue)))
    }

    /// How long a node may stay in this state before it is failed (`None`: as long as it likes).
    pub fn limit_ms(self) -> Option<i64> {
        const MINUTE: i64 = 60_000;
        match self {
            Enrolling => Some(10 * MINUTE),
            Inspecting => Some(30 * MINUTE),
            Commissioning | Deploying | Releasing => Some(60 * MINUTE),
            Retiring => Some(30 * MINUTE),
            Adopting | Adopted | Ready | Deployed | Rescue | Failed | Retired => None,
        }
    }
}

/// The longest reason a move takes.
pub const MAX_REASON_CHARS: usize = 512;

/// Moves the node to `to`, when its lifecycle allows it.
pub fn change_provision(
    node: &Node,
    to: ProvisionState,
    reason: Option<String>,
    now_ms: i64,
) -> Result<Vec<NodeEvent>, Rejection> {
    if node.deleted_at_ms.is_some() {
        return Err(Rejection::NotFound { kind: "node", id: node.id.to_string() });
    }
    if let Some(reason) = &reason
        && (reason.chars().count() > MAX_REASON_CHARS || reason.contains('\0'))
    {
        return Err(Rejection::invalid("reason", format!("at most {MAX_REASON_CHARS} characters, no NUL")));
    }
    let from = node.provision_state;
    if !from.may_go_to(to) {
        let mut allowed: Vec<&str> = from.next().iter().map(|s| s.as_str()).collect();
        if from != Retired {
            allowed.extend(["failed", "rescue"].iter().filter(|s| **s != from.as_str()));
        }
        let allowed = if allowed.is_empty() { "nowhere: it is final".to_owned() } else { allowed.join(", ") };
        return Err(Rejection::Conflict(format!(
            "node {} is {}: it cannot go to {} (from {} it goes to {allowed})",
            node.id,
            from.as_str(),
            to.as_str(),
            from.as_str()
        )));
    }
    Ok(vec![NodeEvent::ProvisionChanged(NodeProvisionChanged {
        node_id: node.id.clone(),
        from,
        to,
        reason,
        at_ms: now_ms,
    })])
}

/// The lifecycle controller's look at a node whose transitional state may have lasted too long: the move to
/// `failed` when it did, nothing when the node moved on or has time left.
pub fn fail_if_stuck(node: &Node, now_ms: i64) -> Vec<NodeEvent> {
    let state = node.provision_state;
    let (Some(limit), Some(since)) = (state.limit_ms(), node.provision_since_ms) else { return Vec::new() };
    if node.deleted_at_ms.is_some() || now_ms < since + limit {
        return Vec::new();
    }
    vec![NodeEvent::ProvisionChanged(NodeProvisionChanged {
        node_id: node.id.clone(),
        from: state,
        to: Failed,
        reason: Some(format!("stuck in {} for more than {} s", state.as_str(), limit / 1000)),
        at_ms: now_ms,
    })]
}

/// When the lifecycle controller should look at the node again (the end of its state's limit), if ever.
pub fn next_look(node: &Node) -> Option<i64> {
    if node.deleted_at_ms.is_some() {
        return None;
    }
    Some(node.provision_since_ms? + node.provision_state.limit_ms()?)
}

/// The most characters of a BMC address or system id.
pub const MAX_BMC_ADDRESS: usize = 255;

/// Checks a BMC as enrolment gives it: the address's form for its driver, and drivers bound to concerns they
/// implement (the BMC's own driver carries power and boot unless told otherwise).
pub fn check_bmc(bmc: &NodeBmc) -> Result<(), Rejection> {
    let address = bmc.address.as_str();
    let printable =
        |text: &str| !text.is_empty() && text.len() <= MAX_BMC_ADDRESS && text.chars().all(|c| c.is_ascii_graphic());
    match bmc.driver {
        BmcDriver::Redfish => {
            let rest = address.strip_prefix("https://").or_else(|| address.strip_prefix("http://"));
            if !printable(address) || rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
                return Err(Rejection::invalid("bmc.address", "a Redfish BMC is https://host[:port] (or http://)"));
            }
        }
        BmcDriver::Ipmi => {
            if !printable(address) || address.contains('/') {
                return Err(Rejection::invalid("bmc.address", "an IPMI BMC is host[:port]"));
            }
        }
    }
    if let Some(system) = &bmc.system_id
        && !printable(system)
    {
        return Err(Rejection::invalid("bmc.systemId", "1 to 255 printable characters"));
    }
    if let Some(mac) = &bmc.boot_mac
        && normalize_mac(mac).as_deref() != Ok(mac.as_str())
    {
        return Err(Rejection::invalid("bootMac", "a MAC address in lowercase, colon-separated (aa:bb:cc:dd:ee:ff)"));
    }
    for (concern, driver) in &bmc.drivers {
        let field = format!("drivers.{}", concern.as_str());
        let Some(concerns) = concerns_of(driver) else {
            return Err(Rejection::invalid(field, format!("{driver:?} is not a driver")));
        };
        if !concerns.contains(concern) {
            return Err(Rejection::invalid(field, format!("driver {driver} does not implement {}", concern.as_str())));
        }
        if matches!(driver.as_str(), "redfish" | "ipmi") && driver != bmc.driver.as_str() {
            return Err(Rejection::invalid(
                field,
                format!("this machine's BMC speaks {}, not {driver}", bmc.driver.as_str()),
            ));
        }
    }
    Ok(())
}

/// A MAC address as the boot path keys it: six hex pairs, separated by `:` or `-`, any case, answered in
/// lowercase with colons.
pub fn normalize_mac(text: &str) -> Result<String, Rejection> {
    let refuse = || Rejection::invalid("bootMac", format!("{text:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    let pairs: Vec<&str> = text.split([':', '-']).collect();
    if text.len() != 17
        || pairs.len() != 6
        || !pairs.iter().all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(refuse());
    }
    Ok(pairs.join(":").to_ascii_lowercase())
}

/// The driver bindings of a machine enrolled with `driver` and `given` bindings: the BMC's driver for power,
/// management and boot (and virtual media with Redfish), `bcd` for deploy and inspect, unless given otherwise.
pub fn default_drivers(driver: BmcDriver, given: &BTreeMap<Concern, String>) -> BTreeMap<Concern, String> {
    let mut drivers = BTreeMap::new();
    let bmc = driver.as_str().to_owned();
    for concern in [Concern::Power, Concern::Management, Concern::Boot] {
        drivers.insert(concern, bmc.clone());
    }
    if driver == BmcDriver::Redfish {
        drivers.insert(Concern::VirtualMedia, bmc);
    }
    for concern in [Concern::Deploy, Concern::Inspect] {
        drivers.insert(concern, "bcd".to_owned());
    }
    drivers.extend(given.iter().map(|(c, d)| (*c, d.clone())));
    drivers
}

/// The BMC event of a machine just enrolled.
pub fn enrolled_bmc(node_id: &NodeId, bmc: NodeBmc, now_ms: i64) -> Result<NodeEvent, Rejection> {
    check_bmc(&bmc)?;
    Ok(NodeEvent::BmcSet(NodeBmcSet { node_id: node_id.clone(), bmc, at_ms: now_ms }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_addresses_are_normalized_and_anything_else_is_refused() {
        assert_eq!(normalize_mac("00-5C-52-31-3A-9C").expect("dashes"), "00:5c:52:31:3a:9c");
        assert_eq!(normalize_mac("00:5c:52:31:3a:9c").expect("colons"), "00:5c:52:31:3a:9c");
        for bad in ["", "00:5c:52:31:3a", "00:5c:52:31:3a:9g", "005c.5231.3a9c", "00:5c:52:31:3a:9c:00"] {
            assert!(normalize_mac(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_bare_metal_path_runs_in_order_and_every_state_but_retired_may_fail() {
        let path = [Enrolling, Inspecting, Commissioning, Ready, Deploying, Deployed, Releasing, Ready];
        for pair in path.windows(2) {
            assert!(pair[0].may_go_to(pair[1]), "{:?} -> {:?}", pair[0], pair[1]);
        }
        for state in
            [Adopting, Adopted, Enrolling, Inspecting, Commissioning, Ready, Deploying, Deployed, Releasing, Retiring]
        {
            assert!(state.may_go_to(Failed) && state.may_go_to(Rescue), "{state:?}");
        }
        assert!(!Retired.may_go_to(Failed) && !Retired.may_go_to(Rescue) && Retired.next().is_empty());
        for state in [Ready, Adopted, Deployed] {
            assert!(state.may_go_to(Retiring));
        }
        for (from, to) in
            [(Enrolling, Deployed), (Ready, Deployed), (Deploying, Ready), (Adopted, Deploying), (Failed, Failed)]
        {
            assert!(!from.may_go_to(to), "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn transitional_states_have_limits_and_resting_ones_none() {
        for state in [Enrolling, Inspecting, Commissioning, Deploying, Releasing, Retiring] {
            assert!(state.limit_ms().is_some(), "{state:?}");
        }
        for state in [Adopted, Ready, Deployed, Failed, Rescue, Retired] {
            assert_eq!(state.limit_ms(), None, "{state:?}");
        }
    }

    #[test]
    fn a_bmc_is_checked_naming_the_field() {
        let bmc = |driver, address: &str, drivers: &[(Concern, &str)]| NodeBmc {
            driver,
            address: address.into(),
            system_id: None,
            insecure_tls: false,
            drivers: drivers.iter().map(|(c, d)| (*c, (*d).to_owned())).collect(),
            boot_mac: None,
        };
        assert!(check_bmc(&bmc(BmcDriver::Redfish, "https://10.0.0.1:8443", &[])).is_ok());
        assert!(check_bmc(&bmc(BmcDriver::Ipmi, "10.0.0.1:623", &[])).is_ok());
        for (b, field) in [
            (bmc(BmcDriver::Redfish, "10.0.0.1", &[]), "bmc.address"),
            (bmc(BmcDriver::Redfish, "https://", &[]), "bmc.address"),
            (bmc(BmcDriver::Ipmi, "https://x", &[]), "bmc.address"),
            (bmc(BmcDriver::Redfish, "https://x", &[(Concern::Power, "ipmi")]), "drivers.power"),
            (bmc(BmcDriver::Redfish, "https://x", &[(Concern::Deploy, "redfish")]), "drivers.deploy"),
            (bmc(BmcDriver::Redfish, "https://x", &[(Concern::Power, "smoke-signals")]), "drivers.power"),
        ] {
            let err = check_bmc(&b).expect_err(field);
            assert!(matches!(&err, Rejection::InvalidArgument { field: f, .. } if f == field), "{field}: {err}");
        }
        let drivers = default_drivers(BmcDriver::Ipmi, &BTreeMap::new());
        assert_eq!(drivers.get(&Concern::Power).map(String::as_str), Some("ipmi"));
        assert_eq!(drivers.get(&Concern::Deploy).map(String::as_str), Some("bcd"));
        assert!(!drivers.contains_key(&Concern::VirtualMedia));
    }
}
