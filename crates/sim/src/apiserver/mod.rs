//! The embedded API server.

pub mod errors;
pub mod resources;
pub mod store;
