//! What every controller loop of the project needs, shared by the virtual node (`tensile-node`)
//! and the placement components (`tensile-placement`): watches that back off and wake up
//! ([`backoff`]), API errors sorted by what follows from them ([`api_error`]), compact watch caches ([`cache`]), a keyed work queue with delayed requeue
//! ([`queue`]) and the controller skeleton that runs on it ([`controller`]), the marks an index keeps ([`marks`]) behind its one lock ([`lock`]), an event sink ([`events`]), leader election ([`leader`]), rate-limited and
//! counted clients ([`clients`]) on HTTP/2 ([`transport`]), the metrics and probes listener with readiness
//! ([`metrics`]), and the TLS server plumbing ([`tls`]).
#![forbid(unsafe_code)]

pub mod api_error;
pub mod backoff;
pub mod cache;
pub mod client_error;
pub mod clients;
pub mod controller;
pub mod events;
pub mod leader;
pub mod lock;
pub mod maps;
pub mod marks;
pub mod metrics;
pub mod queue;
pub mod tls;
pub mod transport;
