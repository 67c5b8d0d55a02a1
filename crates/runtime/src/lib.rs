//! What every controller loop of the project needs, shared by the virtual node (`tensile-node`)
//! and the placement components (`tensile-placement`): watches that back off and wake up
//! ([`backoff`]), compact watch caches ([`cache`]), a keyed work queue with delayed requeue
//! ([`queue`]), an event sink ([`events`]), leader election ([`leader`]), rate-limited and
//! counted clients ([`clients`]) on HTTP/2 ([`transport`]), the metrics and probes listener with readiness
//! ([`metrics`]), and the TLS server plumbing ([`tls`]).
#![forbid(unsafe_code)]

pub mod backoff;
pub mod cache;
pub mod client_error;
pub mod clients;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod tls;
pub mod transport;
