//! The kubelet API end to end against real clients, one module a file (each says what it covers).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

mod kube_rs;
mod kubectl;
mod protocols;
mod server;
mod spdy_session;
