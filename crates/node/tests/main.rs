//! The virtual node end to end between clusters, one module a file (each says what it covers).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

mod checklist;
mod clients;
mod copies;
mod events;
mod kubelet_auth;
mod leader;
mod lower_backend;
mod node_identity;
mod offload;
mod reach;
mod services;
mod volumes;
