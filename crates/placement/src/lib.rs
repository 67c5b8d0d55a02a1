//! Where pods go across lower clusters: the mutating webhook, the descheduler and the
//! scheduler extender.
//!
//! Built in issue 7 on top of `tensile-core`'s codec and fit predicates.
#![forbid(unsafe_code)]
