//! Where pods go across lower clusters: the mutating webhook, the descheduler and the
//! scheduler extender. The rules themselves are pure functions in `tensile-core`
//! (`inject`, `deschedule`, `extender`); this crate serves and drives them.
#![forbid(unsafe_code)]

pub mod bounded;
pub mod ca_bundle;
pub mod descheduler;
pub mod extender;
pub mod metrics;
pub mod serve;
pub mod tls_secret;
pub mod webhook;
