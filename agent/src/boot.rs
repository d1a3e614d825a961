//! The site agent's boot path: see the module's functions.
