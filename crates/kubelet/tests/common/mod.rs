//! Shared by the integration tests: a fake container backend, a small SPDY client built on the
//! crate's codec, and an HTTPS front that plays the API server (and a kubelet) for real clients.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

pub mod backend;
pub mod front;
pub mod spdy_client;

use std::future::Future;
use std::time::Duration;

/// Awaits `fut` or fails the test after `secs` seconds, naming what was awaited.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s waiting for {what}"),
    }
}
