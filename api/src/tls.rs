//! Serving over TLS: the listener lives in `bcx` (drivers serve their protocol through it too).

pub use bcx::tls::*;
