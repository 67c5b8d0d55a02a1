//! An embedded Kubernetes API server with a simulated scheduler and simulated kubelets: the
//! clusters of `tensile up` and of the tests (`tensile-testenv` starts them).
#![forbid(unsafe_code)]

pub mod apiserver;
