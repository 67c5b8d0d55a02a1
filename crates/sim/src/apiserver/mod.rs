//! The embedded API server.

pub mod errors;
pub mod request;
pub mod resources;
pub mod store;
