//! Ids: generated ones are `<prefix>_<ulid>` in lower-case Crockford base32, monotonic within a process;
//! reservation ids are derived from the request; tenants, identities and devices carry ids made elsewhere.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use ulid::{Generator, Ulid};

/// The process-wide ULID generator. ULIDs made in the same millisecond still sort in creation order,
/// because the generator increments the random part instead of drawing a new one.
static GENERATOR: Mutex<Option<Generator>> = Mutex::new(None);

/// The lower-case Crockford base32 alphabet (no i, l, o, u).
const CROCKFORD: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// A new ULID, greater than every ULID this process made before.
pub fn new_ulid() -> Ulid {
    let mut guard = GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let generator = guard.get_or_insert_with(Generator::new);
    match generator.generate() {
        Ok(ulid) => ulid,
        // 2^80 ids in one millisecond overflow the random part; the next millisecond starts afresh.
        Err(_) => {
            std::thread::sleep(std::time::Duration::from_millis(1));
            generator.generate().unwrap_or_else(|_| Ulid::new())
        }
    }
}

/// A new id such as `site_01jd8w2k3m4n5p6q7r8s9t0v1w`: the prefix, an underscore and a lower-case ULID.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 27);
    id.push_str(prefix);
    id.push('_');
    id.push_str(&new_ulid().to_string().to_ascii_lowercase());
    id
}

/// Lower-case Crockford base32 of `bytes`, most significant bits first, without padding.
pub fn crockford_base32(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 8 / 5 + 1);
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for &byte in bytes {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(CROCKFORD[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(CROCKFORD[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// Whether each byte value is a letter of [`CROCKFORD`]: one load a byte, where searching the alphabet took a
/// `memchr` over its 32 letters for each of an id's 26 or 52 (about a third of decoding a reservation's events).
const IS_CROCKFORD: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < CROCKFORD.len() {
        table[CROCKFORD[i] as usize] = true;
        i += 1;
    }
    table
};

fn is_crockford(body: &str) -> bool {
    body.bytes().all(|b| IS_CROCKFORD[usize::from(b)])
}

/// A text that is not an id of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {input:?}: {expected}")]
pub struct IdError {
    pub kind: &'static str,
    pub input: String,
    pub expected: String,
}

impl IdError {
    fn new(kind: &'static str, input: &str, expected: String) -> Self {
        Self { kind, input: input.chars().take(80).collect(), expected }
    }
}

/// The conversions every string id shares: from a `String` (parsing it), into a `String`, and `Display`.
macro_rules! string_id_conversions {
    ($name:ident) => {
        impl TryFrom<String> for $name {
            type Error = IdError;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                value.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

/// Declares a generated id: `<prefix>_` and 26 lower-case Crockford base32 characters.
macro_rules! generated_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;
            /// The id's text as a regular expression (for schemas that describe it).
            pub const PATTERN: &'static str = concat!("^", $prefix, "_[0-9a-hjkmnp-tv-z]{26}$");

            /// A new id, later than every id this process made before.
            pub fn generate() -> Self {
                Self(new_id($prefix))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(input: &str) -> Result<Self, Self::Err> {
                let body = input.strip_prefix(concat!($prefix, "_"));
                match body {
                    Some(body) if body.len() == 26 && is_crockford(body) => Ok(Self(input.to_owned())),
                    _ => Err(IdError::new(
                        $kind,
                        input,
                        format!("expected {}_ followed by 26 lower-case Crockford base32 characters", $prefix),
                    )),
                }
            }
        }


        string_id_conversions!($name);
    };
}

generated_id!(
    /// A site: a boot and failure domain.
    SiteId, "site", "site id"
);
generated_id!(
    /// A pool: a scheduling and policy domain in one site.
    PoolId, "pool", "pool id"
);
generated_id!(
    /// A node: a machine running `bcd`.
    NodeId, "node", "node id"
);
generated_id!(
    /// A project: an application-owned grouping inside a tenant.
    ProjectId, "prj", "project id"
);
generated_id!(
    /// An allocation: a reservation's placement on one node.
    AllocationId, "alloc", "allocation id"
);
generated_id!(
    /// A join token's id (the token itself is a secret, `jt_...`, shown once).
    JoinTokenId, "jtk", "join token id"
);
generated_id!(
    /// A command to one node.
    CommandId, "cmd", "command id"
);
generated_id!(
    /// An identity administered through the API (its name, such as `alice@acme`, is unique in its tenant).
    IdentityId, "idt", "identity id"
);
generated_id!(
    /// A bearer token's id (the token itself is a secret, `bct_...`, shown once).
    TokenId, "tok", "token id"
);
generated_id!(
    /// A grant of a pool relation to identities of a tenant.
    GrantId, "grt", "grant id"
);
generated_id!(
    /// An attribute limit on reservations in a pool.
    LimitId, "lim", "limit id"
);
generated_id!(
    /// An image: a signed, content-addressed disk or boot artifact.
    ImageId, "img", "image id"
);
generated_id!(
    /// A profile version: a provisioning template.
    ProfileId, "prof", "profile id"
);
generated_id!(
    /// A flavor: the shape instances are made in.
    FlavorId, "flv", "flavor id"
);
generated_id!(
    /// A provider account: how a tenant reaches an external capacity API.
    ProviderAccountId, "pacct", "provider account id"
);
generated_id!(
    /// A webhook subscription: a tenant's events POSTed, signed, to a URL of its own.
    WebhookId, "whk", "webhook id"
);
generated_id!(
    /// A workflow: a profile expanded for one machine into persisted steps.
    WorkflowId, "wf", "workflow id"
);
generated_id!(
    /// An agent's session: one run of `bcd` on a node, renewed by its heartbeats.
    SessionId, "ses", "session id"
);

/// Declares an id derived from a request: `<prefix>_` and the 52-character lower-case Crockford base32 of
/// SHA-256 over the tenant, the caller's identity and the idempotency key, so a retry finds the same thing.
macro_rules! derived_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;
            /// The id's text as a regular expression (for schemas that describe it).
            pub const PATTERN: &'static str = concat!("^", $prefix, "_[0-9a-hjkmnp-tv-z]{52}$");

            /// The id a request gets: the same three inputs always give the same id.
            pub fn derive(tenant: &TenantId, identity: &Identity, idempotency_key: &str) -> Self {
                let mut hasher = Sha256::new();
                hasher.update(tenant.as_str().as_bytes());
                hasher.update([0]);
                hasher.update(identity.as_str().as_bytes());
                hasher.update([0]);
                hasher.update(idempotency_key.as_bytes());
                Self(format!(concat!($prefix, "_{}"), crockford_base32(&hasher.finalize())))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(input: &str) -> Result<Self, Self::Err> {
                match input.strip_prefix(concat!($prefix, "_")) {
                    Some(body) if body.len() == 52 && is_crockford(body) => Ok(Self(input.to_owned())),
                    _ => Err(IdError::new(
                        $kind,
                        input,
                        concat!("expected ", $prefix, "_ followed by 52 lower-case Crockford base32 characters")
                            .to_owned(),
                    )),
                }
            }
        }

        string_id_conversions!($name);
    };
}

derived_id!(
    /// A reservation: derived from its request, so a retry finds the same reservation.
    ReservationId, "rsv", "reservation id"
);
derived_id!(
    /// An instance: derived from its request, so a retry finds the same instance.
    InstanceId, "inst", "instance id"
);

impl InstanceId {
    /// The id of the `binding: instance` reservation that holds this instance's allocation: derived from the
    /// instance's id, so the instance's retry finds it too, and no reservation key of the caller's can make it
    /// (an idempotency key has no NUL).
    pub fn reservation_id(&self, tenant: &TenantId, identity: &Identity) -> ReservationId {
        ReservationId::derive(tenant, identity, &format!("\0instance:{}", self.0))
    }
}

/// Declares an id made elsewhere (by Better IAM, by the hardware): checked for length and characters only.
macro_rules! external_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal, $max:literal, $allowed:expr, $allowed_text:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(input: &str) -> Result<Self, Self::Err> {
                let allowed: fn(char) -> bool = $allowed;
                if input.is_empty() || input.chars().count() > $max || !input.chars().all(allowed) {
                    return Err(IdError::new(
                        $kind,
                        input,
                        format!("expected 1 to {} characters of {}", $max, $allowed_text),
                    ));
                }
                Ok(Self(input.to_owned()))
            }
        }


        string_id_conversions!($name);
    };
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
}

fn is_printable(c: char) -> bool {
    !c.is_control()
}

fn is_device_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/')
}

external_id!(
    /// A Better IAM tenant. The root tenant is the platform; organizations are customers.
    TenantId, "tenant id", 128, is_token_char, "letters, digits, '_', '-', '.' and ':'"
);

impl TenantId {
    /// The id's text as a regular expression (for schemas that describe it).
    pub const PATTERN: &'static str = "^[A-Za-z0-9_.:-]{1,128}$";
}
external_id!(
    /// The authenticated caller, as the authorizer names it.
    Identity, "identity", 256, is_printable, "printable characters"
);
external_id!(
    /// A device: stable across restarts (GPU UUID, `<uuid>/gi<g>/ci<c>`, `<uuid>/s<k>`, disk WWN, MAC).
    DeviceId, "device id", 200, is_device_char, "letters, digits, '_', '-', '.', ':' and '/'"
);

impl DeviceId {
    /// The MIG instance `<gpu>/gi<g>/ci<c>`.
    pub fn mig(gpu: &DeviceId, gpu_instance: u32, compute_instance: u32) -> DeviceId {
        DeviceId(format!("{}/gi{gpu_instance}/ci{compute_instance}", gpu.0))
    }

    /// The whole-node atom `<node>/node` of a node in a `tenantRoot` pool.
    pub fn whole_node(node: &NodeId) -> DeviceId {
        DeviceId(format!("{}/node", node.0))
    }

    /// The time-slice or MPS slot `<gpu>/s<k>`.
    pub fn slot(gpu: &DeviceId, slot: u32) -> DeviceId {
        DeviceId(format!("{}/s{slot}", gpu.0))
    }
}

#[cfg(test)]
mod tests;
