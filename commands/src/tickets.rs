//! Stream tickets: a browser's `EventSource` cannot send an `Authorization` header, so a caller trades its bearer
//! token for a short-lived ticket to put in the stream's URL. A ticket names the caller and when it expires,
//! signed with HMAC-SHA256 under a key derived from the PKI bundle's (so every process, and a restarted one,
//! takes it; without a bundle the key is this process's own). Each use looks its identity up in the
//! authorizer, so a deleted identity's ticket stops working with it, and decides the stream as for its token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bc_domain::Rejection;
use bc_pki::seal::Sealer;
use bc_pki::{from_hex, hex};

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

/// What a ticket's signature is made over.
fn signed(payload: &str) -> String {
    format!("stream-ticket:{payload}")
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl App {
    /// What signs tickets: the bundle's key, or without a bundle this process's own.
    fn ticket_signer(&self) -> &Sealer {
        self.pki.as_ref().map_or(&self.process_sealer, |bundle| bundle.sealer())
    }

    /// A ticket for `call`'s principal.
    pub fn issue_stream_ticket(&self, call: &Call) -> StreamTicket {
        let expires_at_ms = now_ms() + TICKET_LIFETIME.as_millis() as i64;
        let p = &call.principal;
        let payload = format!("{}\n{}\n{expires_at_ms}", p.tenant_id, p.identity);
        let mac = self.ticket_signer().derive(&signed(&payload));
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
        let (Some(payload), Some(mac)) = (from_hex(payload), from_hex(mac)) else { return Err(refused("malformed")) };
        let text = String::from_utf8(payload).map_err(|_| refused("malformed"))?;
        if !self.ticket_signer().verify_derived(&signed(&text), &mac) {
            return Err(refused("not one this service issued"));
        }
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
