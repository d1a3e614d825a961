//! Stream tickets: a browser's `EventSource` cannot send an `Authorization` header, so a caller trades its bearer
//! token for a short-lived ticket to put in the stream's URL. A ticket names the caller and when it expires,
//! signed with HMAC-SHA256 under a key from the PKI bundle (so every process, and a restarted one, takes it;
//! without a bundle the key is this process's own). It is checked against the authorizer on every use: a
//! deleted identity's or a suspended tenant's ticket stops working with it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bc_domain::Rejection;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::door::Call;
use crate::{App, AppResult};

/// How long a ticket works: long enough for a page to reconnect across a server restart.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(300);

/// A ticket as issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTicket {
    pub ticket: String,
    pub expires_at_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 2048 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

impl App {
    fn ticket_mac(&self, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.ticket_key()).expect("HMAC takes any key");
        mac.update(payload);
        mac
    }

    /// The key tickets are signed with.
    fn ticket_key(&self) -> [u8; 32] {
        match &self.pki {
            Some(bundle) => bundle.sealer().derive("stream-ticket-key"),
            None => self.process_key,
        }
    }

    /// A ticket for `call`'s principal.
    pub fn issue_stream_ticket(&self, call: &Call) -> StreamTicket {
        let expires_at_ms = now_ms() + TICKET_LIFETIME.as_millis() as i64;
        let p = &call.principal;
        let payload = format!("{}\n{}\n{expires_at_ms}", p.tenant_id, p.identity);
        let mac = self.ticket_mac(payload.as_bytes()).finalize().into_bytes();
        StreamTicket { ticket: format!("bst_{}_{}", hex(payload.as_bytes()), hex(&mac)), expires_at_ms }
    }

    /// Who a ticket speaks for: `UNAUTHENTICATED` when it is malformed, forged, expired, or its identity is gone.
    pub fn authenticate_ticket(&self, ticket: &str, request_id: &str) -> AppResult<Call> {
        let refused = |why: &str| {
            self.denials.count("any", "unauthenticated");
            tracing::info!(request_id, why, "denied: stream ticket");
            Rejection::Unauthenticated(format!("the stream ticket is {why}: ask for a new one")).into()
        };
        let Some((payload, mac)) = ticket.strip_prefix("bst_").and_then(|t| t.split_once('_')) else {
            return Err(refused("malformed"));
        };
        let (Some(payload), Some(mac)) = (unhex(payload), unhex(mac)) else { return Err(refused("malformed")) };
        if self.ticket_mac(&payload).verify_slice(&mac).is_err() {
            return Err(refused("not one this service issued"));
        }
        let text = String::from_utf8(payload).map_err(|_| refused("malformed"))?;
        let mut fields = text.split('\n');
        let (Some(tenant), Some(identity), Some(expires), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(refused("malformed"));
        };
        if expires.parse::<i64>().map_or(true, |expires| expires < now_ms()) {
            return Err(refused("expired"));
        }
        let (Ok(tenant), Ok(identity)) = (tenant.parse(), identity.parse()) else { return Err(refused("malformed")) };
        match self.auth.principal(&tenant, &identity) {
            Some(principal) => Ok(Call { principal, request_id: request_id.to_owned() }),
            None => Err(refused("for an identity that is no longer known")),
        }
    }
}
