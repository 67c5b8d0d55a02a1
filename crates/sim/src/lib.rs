//! An embedded Kubernetes API server with a simulated scheduler and simulated kubelets, and a
//! `TestEnv` that starts simulated or real clusters for tests, benchmarks and `tensile up`.
//!
//! Built in issue 3.
#![forbid(unsafe_code)]
