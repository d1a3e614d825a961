//! Profiles: versioned provisioning templates. A profile says how a machine of a `metal` or `vps` target is
//! provisioned: which driver carries each concern, the image it is deployed from, the user data and host
//! configuration it is given, the steps of its workflow and the acceptance checks it must pass. A profile's
//! name holds versions 1, 2, ... in its tenant; each version is a stream of its own (`prof_...`) and never
//! changes once created, so a workflow always runs the template it was expanded from: a change is a new version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{ImageId, ProfileId, TenantId};

/// What a profile provisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileTarget {
    /// A whole machine, from its BMC.
    Metal,
    /// A virtual machine on a host.
    Vps,
}

/// What a driver can be responsible for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Concern {
    Power,
    Management,
    Boot,
    Deploy,
    Inspect,
    Console,
    VirtualMedia,
    Bios,
    Raid,
    Firmware,
    Config,
    Runtime,
}

impl Concern {
    pub fn as_str(self) -> &'static str {
        match self {
            Concern::Power => "power",
            Concern::Management => "management",
            Concern::Boot => "boot",
            Concern::Deploy => "deploy",
            Concern::Inspect => "inspect",
            Concern::Console => "console",
            Concern::VirtualMedia => "virtual-media",
            Concern::Bios => "bios",
            Concern::Raid => "raid",
            Concern::Firmware => "firmware",
            Concern::Config => "config",
            Concern::Runtime => "runtime",
        }
    }
}

/// The drivers this build has, and the concerns each implements.
pub const DRIVERS: &[(&str, &[Concern])] = &[
    // A BMC speaking Redfish: power, the one-time boot device, virtual media, and the system's inventory.
    ("redfish", &[Concern::Power, Concern::Management, Concern::Boot, Concern::VirtualMedia, Concern::Inspect]),
    // An older BMC through ipmitool: power and the one-time boot device.
    ("ipmi", &[Concern::Power, Concern::Management, Concern::Boot]),
    // The ramdisk and the deployed agent: inspection, writing the image and the configuration, the runtime.
    ("bcd", &[Concern::Deploy, Concern::Inspect, Concern::Config, Concern::Runtime]),
];

/// The prefix of out-of-process drivers, `bcx:<name>`: the site agent calls them over the driver protocol
/// (`bcx/v1`) at the address it was started with for that name.
pub const EXTERNAL_DRIVER_PREFIX: &str = "bcx:";

/// The concerns an out-of-process driver can carry: a machine's power and its one-time boot device.
pub const EXTERNAL_CONCERNS: &[Concern] = &[Concern::Power, Concern::Management, Concern::Boot];

/// The concerns driver `name` implements: a built-in one's, or an out-of-process one's (`bcx:` and 1 to 64
/// lowercase letters, digits or '-'). `None` for a name that is neither.
pub fn concerns_of(name: &str) -> Option<&'static [Concern]> {
    if let Some(external) = name.strip_prefix(EXTERNAL_DRIVER_PREFIX) {
        let valid = !external.is_empty()
            && external.len() <= 64
            && external.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        return valid.then_some(EXTERNAL_CONCERNS);
    }
    DRIVERS.iter().find(|(known, _)| *known == name).map(|(_, concerns)| *concerns)
}

/// Where a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunsOn {
    ControlPlane,
    Site,
    Node,
    Ramdisk,
}

impl RunsOn {
    pub fn as_str(self) -> &'static str {
        match self {
            RunsOn::ControlPlane => "control-plane",
            RunsOn::Site => "site",
            RunsOn::Node => "node",
            RunsOn::Ramdisk => "ramdisk",
        }
    }
}

/// What a step does. Each action runs in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepAction {
    /// The site agent, through the power driver.
    PowerOn,
    PowerOff,
    PowerReset,
    /// The site agent, through the boot driver: the next boot only.
    BootFromNetwork,
    BootFromDisk,
    BootFromVirtualMedia,
    /// The site agent, through the virtual-media driver.
    InsertVirtualMedia,
    EjectVirtualMedia,
    /// The ramdisk.
    Inspect,
    WipeDisks,
    WriteImage,
    WriteConfig,
    /// The deployed agent.
    RunAcceptance,
    /// The control plane: waits for the node's agent to join.
    AwaitJoin,
}

impl StepAction {
    /// Where this action runs.
    pub fn runs_on(self) -> RunsOn {
        use StepAction::*;
        match self {
            PowerOn | PowerOff | PowerReset | BootFromNetwork | BootFromDisk | BootFromVirtualMedia
            | InsertVirtualMedia | EjectVirtualMedia => RunsOn::Site,
            Inspect | WipeDisks | WriteImage | WriteConfig => RunsOn::Ramdisk,
            RunAcceptance => RunsOn::Node,
            AwaitJoin => RunsOn::ControlPlane,
        }
    }

    /// The concern whose driver carries this action.
    pub fn concern(self) -> Option<Concern> {
        use StepAction::*;
        match self {
            PowerOn | PowerOff | PowerReset => Some(Concern::Power),
            BootFromNetwork | BootFromDisk | BootFromVirtualMedia => Some(Concern::Boot),
            InsertVirtualMedia | EjectVirtualMedia => Some(Concern::VirtualMedia),
            Inspect => Some(Concern::Inspect),
            WipeDisks | WriteImage | WriteConfig => Some(Concern::Deploy),
            RunAcceptance => Some(Concern::Runtime),
            AwaitJoin => None,
        }
    }
}

/// What a step waits for after it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Await {
    /// The step ends the agent's boot: the workflow goes on once the agent is back.
    Rejoin,
}

/// One step of a profile's workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepSpec {
    /// Unique in the profile: 1 to 64 of a-z, 0-9 and `-`.
    pub name: String,
    pub action: StepAction,
    /// Where it runs; the action's place when not given.
    pub runs_on: RunsOn,
    /// How long one attempt may take, in seconds.
    pub timeout_s: u32,
    /// How many attempts in all (1: no retry).
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<Await>,
}

/// A profile's content: everything but its identity and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileSpec {
    pub target: ProfileTarget,
    /// The driver bound to each concern.
    pub drivers: BTreeMap<Concern, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<ImageId>,
    /// Deploy the image even if no allowed signer verified it (never by default).
    #[serde(default)]
    pub allow_unverified_image: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// Host configuration handed to the deployed machine (such as `hostname`).
    #[serde(default)]
    pub host_config: BTreeMap<String, String>,
    /// Acceptance checks the deployed machine must pass, in the pools' check syntax.
    #[serde(default)]
    pub acceptance: Vec<String>,
}

/// The most steps a profile holds.
pub const MAX_STEPS: usize = 64;
/// The largest user data, in bytes (a request body holds at most 64 KiB).
pub const MAX_USER_DATA_BYTES: usize = 32 * 1024;
/// The most host configuration entries, and the longest value.
pub const MAX_HOST_CONFIG: usize = 64;
pub const MAX_HOST_CONFIG_VALUE: usize = 1024;
/// The longest a step's attempt may be given (a day), and the most attempts.
pub const MAX_STEP_TIMEOUT_S: u32 = 86_400;
pub const MAX_STEP_ATTEMPTS: u32 = 10;

fn check_slug(field: &str, text: &str, max: usize) -> Result<(), Rejection> {
    let ok = !text.is_empty()
        && text.len() <= max
        && text.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Rejection::invalid(
            field,
            format!("must be 1 to {max} of a-z, 0-9 and '-', starting with a letter or a digit"),
        ))
    }
}

/// Checks a profile's name.
pub fn check_name(name: &str) -> Result<(), Rejection> {
    check_slug("name", name, 64)
}

impl ProfileSpec {
    /// Checks everything that can be checked without the store: drivers against what they implement, steps,
    /// sizes, and that a metal profile has what a deployment needs.
    pub fn check(&self) -> Result<(), Rejection> {
        for (concern, driver) in &self.drivers {
            let field = format!("drivers.{}", concern.as_str());
            let Some(concerns) = concerns_of(driver) else {
                let known: Vec<&str> = DRIVERS.iter().map(|(name, _)| *name).collect();
                return Err(Rejection::invalid(
                    field,
                    format!("{driver:?} is not a driver ({}, or bcx:<name> out of process)", known.join(", ")),
                ));
            };
            if !concerns.contains(concern) {
                return Err(Rejection::invalid(
                    field,
                    format!("driver {driver} does not implement the {} concern", concern.as_str()),
                ));
            }
        }
        if self.steps.len() > MAX_STEPS {
            return Err(Rejection::invalid("steps", format!("at most {MAX_STEPS} steps")));
        }
        for (n, step) in self.steps.iter().enumerate() {
            let field = |name: &str| format!("steps[{n}].{name}");
            check_slug(&field("name"), &step.name, 64)?;
            if self.steps[..n].iter().any(|other| other.name == step.name) {
                return Err(Rejection::invalid(field("name"), format!("{:?} names two steps", step.name)));
            }
            if step.runs_on != step.action.runs_on() {
                return Err(Rejection::invalid(
                    field("runsOn"),
                    format!("{:?} runs on {}", step.action, step.action.runs_on().as_str()),
                ));
            }
            if let Some(concern) = step.action.concern()
                && !self.drivers.contains_key(&concern)
            {
                return Err(Rejection::invalid(
                    field("action"),
                    format!("needs a driver for the {} concern in drivers", concern.as_str()),
                ));
            }
            if step.timeout_s == 0 || step.timeout_s > MAX_STEP_TIMEOUT_S {
                return Err(Rejection::invalid(
                    field("timeoutS"),
                    format!("must be 1 to {MAX_STEP_TIMEOUT_S} seconds"),
                ));
            }
            if step.attempts == 0 || step.attempts > MAX_STEP_ATTEMPTS {
                return Err(Rejection::invalid(field("attempts"), format!("must be 1 to {MAX_STEP_ATTEMPTS}")));
            }
        }
        if self.user_data.as_ref().is_some_and(|u| u.len() > MAX_USER_DATA_BYTES) {
            return Err(Rejection::invalid("userData", format!("at most {MAX_USER_DATA_BYTES} bytes")));
        }
        if self.user_data.as_ref().is_some_and(|u| u.contains('\0')) {
            return Err(Rejection::invalid("userData", "contains a NUL character"));
        }
        if self.host_config.len() > MAX_HOST_CONFIG {
            return Err(Rejection::invalid("hostConfig", format!("at most {MAX_HOST_CONFIG} entries")));
        }
        for (key, value) in &self.host_config {
            check_slug(&format!("hostConfig.{key}"), key, 64)?;
            if value.len() > MAX_HOST_CONFIG_VALUE || value.chars().any(char::is_control) {
                return Err(Rejection::invalid(
                    format!("hostConfig.{key}"),
                    format!("must be at most {MAX_HOST_CONFIG_VALUE} bytes without control characters"),
                ));
            }
        }
        if self.acceptance.len() > 32 {
            return Err(Rejection::invalid("acceptance", "at most 32 checks"));
        }
        for (n, check) in self.acceptance.iter().enumerate() {
            check
                .parse::<crate::acceptance::Check>()
                .map_err(|err| Rejection::invalid(format!("acceptance[{n}]"), err))?;
        }
        if self.target == ProfileTarget::Metal {
            for concern in [Concern::Power, Concern::Boot, Concern::Deploy] {
                if !self.drivers.contains_key(&concern) {
                    return Err(Rejection::invalid(
                        format!("drivers.{}", concern.as_str()),
                        "a metal profile needs a driver for power, boot and deploy",
                    ));
                }
            }
            if self.image_id.is_none() {
                return Err(Rejection::invalid("imageId", "a metal profile deploys an image"));
            }
        }
        Ok(())
    }
}

/// What the store says of the image a profile names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFacts {
    /// No image of that id that the tenant sees.
    Missing,
    Found {
        verified: bool,
    },
}

/// A profile version as created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileCreated {
    pub profile_id: ProfileId,
    pub tenant_id: TenantId,
    pub name: String,
    pub version: u32,
    /// Boxed: the content is large beside the other events.
    pub spec: Box<ProfileSpec>,
    pub at_ms: i64,
}

/// A profile version was deleted; its number is never given again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileDeleted {
    pub profile_id: ProfileId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a profile version's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum ProfileEvent {
        Created(ProfileCreated) = "profile.created",
        Deleted(ProfileDeleted) = "profile.deleted",
    }
}

/// A profile version as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    #[serde(flatten)]
    pub created: ProfileCreated,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

pub fn evolve_profile(state: Option<Profile>, event: &ProfileEvent) -> Option<Profile> {
    match (state, event) {
        (None, ProfileEvent::Created(e)) => Some(Profile { created: e.clone(), deleted_at_ms: None }),
        (Some(profile), ProfileEvent::Deleted(e)) => Some(Profile { deleted_at_ms: Some(e.at_ms), ..profile }),
        (state, _) => state,
    }
}

/// `profiles.create`: the next version of `name` (`latest`: the highest version the name had, deleted or not).
pub fn create_profile(
    profile_id: &ProfileId,
    tenant_id: &TenantId,
    name: &str,
    spec: ProfileSpec,
    latest: Option<u32>,
    image: Option<ImageFacts>,
    now_ms: i64,
) -> Result<Vec<ProfileEvent>, Rejection> {
    check_name(name)?;
    spec.check()?;
    if let Some(image_id) = &spec.image_id {
        match image {
            None | Some(ImageFacts::Missing) => {
                return Err(Rejection::invalid("imageId", format!("image {image_id} was not found")));
            }
            Some(ImageFacts::Found { verified: false }) if !spec.allow_unverified_image => {
                return Err(Rejection::invalid(
                    "imageId",
                    format!(
                        "image {image_id} is not verified by an allowed signer; set allowUnverifiedImage to deploy it \
                         anyway"
                    ),
                ));
            }
            Some(ImageFacts::Found { .. }) => {}
        }
    }
    let version = latest.unwrap_or(0).checked_add(1).ok_or_else(|| Rejection::invalid("name", "too many versions"))?;
    Ok(vec![ProfileEvent::Created(ProfileCreated {
        profile_id: profile_id.clone(),
        tenant_id: tenant_id.clone(),
        name: name.to_owned(),
        version,
        spec: Box::new(spec),
        at_ms: now_ms,
    })])
}

/// `profiles.delete`: a live version of the caller's tenant.
pub fn delete_profile(profile: Option<&Profile>, id: &ProfileId, now_ms: i64) -> Result<Vec<ProfileEvent>, Rejection> {
    profile
        .filter(|p| p.deleted_at_ms.is_none())
        .ok_or_else(|| Rejection::NotFound { kind: "profile", id: id.to_string() })?;
    Ok(vec![ProfileEvent::Deleted(ProfileDeleted { profile_id: id.clone(), at_ms: now_ms })])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metal() -> ProfileSpec {
        ProfileSpec {
            target: ProfileTarget::Metal,
            drivers: BTreeMap::from([
                (Concern::Power, "redfish".to_owned()),
                (Concern::Boot, "redfish".to_owned()),
                (Concern::Deploy, "bcd".to_owned()),
            ]),
            image_id: Some(ImageId::generate()),
            allow_unverified_image: false,
            user_data: None,
            steps: vec![StepSpec {
                name: "power-on".into(),
                action: StepAction::PowerOn,
                runs_on: RunsOn::Site,
                timeout_s: 60,
                attempts: 3,
                wait_for: None,
            }],
            host_config: BTreeMap::new(),
            acceptance: vec!["gpu-count=8".into()],
        }
    }

    fn create(spec: ProfileSpec, latest: Option<u32>, image: ImageFacts) -> Result<Vec<ProfileEvent>, Rejection> {
        let tenant: TenantId = "acme".parse().expect("tenant");
        create_profile(&ProfileId::generate(), &tenant, "gpu-node", spec, latest, Some(image), 1)
    }

    #[test]
    fn a_profile_s_versions_count_up_from_one() {
        let first = create(metal(), None, ImageFacts::Found { verified: true }).expect("first");
        let next = create(metal(), Some(4), ImageFacts::Found { verified: true }).expect("next");
        let version = |events: &[ProfileEvent]| match &events[0] {
            ProfileEvent::Created(e) => e.version,
            ProfileEvent::Deleted(_) => 0,
        };
        assert_eq!((version(&first), version(&next)), (1, 5));
    }

    #[test]
    fn power_and_boot_may_be_bound_to_an_out_of_process_driver_by_a_valid_name() {
        let mut spec = metal();
        spec.drivers.insert(Concern::Power, "bcx:pdu-switch".to_owned());
        spec.drivers.insert(Concern::Boot, "bcx:pdu-switch".to_owned());
        spec.check().expect("bcx drivers carry power and boot");
        for (concern, driver) in [
            (Concern::Power, "bcx:"),
            (Concern::Power, "bcx:Upper"),
            (Concern::Power, "bcx:a/b"),
            (Concern::Deploy, "bcx:pdu-switch"),
        ] {
            let mut spec = metal();
            spec.drivers.insert(concern, driver.to_owned());
            let refused = spec.check().expect_err(driver);
            let field = format!("drivers.{}", concern.as_str());
            assert!(
                matches!(&refused, Rejection::InvalidArgument { field: f, .. } if *f == field),
                "{driver}: {refused:?}"
            );
        }
    }

    #[test]
    fn an_unverified_image_is_refused_unless_the_profile_says_so() {
        let err = create(metal(), None, ImageFacts::Found { verified: false }).expect_err("unverified");
        assert!(
            matches!(&err, Rejection::InvalidArgument { field, message } if field == "imageId" && message.contains("allowUnverifiedImage"))
        );
        let allowed = ProfileSpec { allow_unverified_image: true, ..metal() };
        create(allowed, None, ImageFacts::Found { verified: false }).expect("explicitly allowed");
        let err = create(metal(), None, ImageFacts::Missing).expect_err("missing");
        assert!(matches!(&err, Rejection::InvalidArgument { field, .. } if field == "imageId"));
    }

    #[test]
    fn bad_specs_are_refused_naming_the_field() {
        let mut unknown_driver = metal();
        unknown_driver.drivers.insert(Concern::Power, "telnet".into());
        let mut wrong_concern = metal();
        wrong_concern.drivers.insert(Concern::Deploy, "ipmi".into());
        let mut wrong_place = metal();
        wrong_place.steps[0].runs_on = RunsOn::Ramdisk;
        let mut twice = metal();
        twice.steps.push(twice.steps[0].clone());
        let mut no_driver = metal();
        no_driver.steps[0].action = StepAction::InsertVirtualMedia;
        let mut zero = metal();
        zero.steps[0].timeout_s = 0;
        let mut bad_check = metal();
        bad_check.acceptance = vec!["gpus=8".into()];
        let mut no_image = metal();
        no_image.image_id = None;
        let mut no_power = metal();
        no_power.drivers.remove(&Concern::Power);
        no_power.steps.clear();
        for (spec, field) in [
            (unknown_driver, "drivers.power"),
            (wrong_concern, "drivers.deploy"),
            (wrong_place, "steps[0].runsOn"),
            (twice, "steps[1].name"),
            (no_driver, "steps[0].action"),
            (zero, "steps[0].timeoutS"),
            (bad_check, "acceptance[0]"),
            (no_image, "imageId"),
            (no_power, "drivers.power"),
        ] {
            let err = create(spec, None, ImageFacts::Found { verified: true }).expect_err(field);
            assert!(matches!(&err, Rejection::InvalidArgument { field: f, .. } if f == field), "{field}: {err}");
        }
    }

    #[test]
    fn only_a_live_version_is_deleted() {
        let tenant: TenantId = "acme".parse().expect("tenant");
        let id = ProfileId::generate();
        let events = create_profile(&id, &tenant, "p", metal(), None, Some(ImageFacts::Found { verified: true }), 1)
            .expect("created");
        let profile = events.iter().fold(None, evolve_profile).expect("folded");
        let deleted = delete_profile(Some(&profile), &id, 2).expect("deleted");
        let gone = deleted.iter().fold(Some(profile), evolve_profile).expect("folded");
        assert!(matches!(delete_profile(Some(&gone), &id, 3), Err(Rejection::NotFound { .. })));
    }
}
