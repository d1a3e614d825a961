//! `bcx`, Better Compute's driver SDK. A driver is a separate process that the control plane calls over a
//! versioned protocol (`bcx/v1`: JSON bodies over HTTP with mutual TLS, [`protocol`]), so operators add drivers
//! without rebuilding the control plane. A driver author implements a trait ([`server::ProviderDriver`]) and
//! serves it in a few lines ([`server::serve`]); the control plane calls every driver, built-in or not, through
//! [`client::DriverClient`]; [`conformance`] checks any running driver against the protocol's rules
//! (`bcx conformance`). [`better_compute`] is the first real provider driver: it borrows GPUs from another
//! Better Compute deployment.

pub mod better_compute;
pub mod client;
pub mod conformance;
pub mod protocol;
pub mod server;
pub mod tls;
