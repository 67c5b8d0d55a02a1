//! An embedded Kubernetes API server with a simulated scheduler and simulated kubelets, and a
//! `TestEnv` that starts simulated or real clusters for tests, benchmarks and `tensile up`.
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod certs;
pub mod env;
pub mod kubelet;
pub mod secret_file;
