//! An embedded Kubernetes API server with its control loops (a simulated scheduler among
//! them): the clusters of `tensile up`, the README tour and the fleet benchmark, and of the
//! tests on the simulator (`tensile-testenv` starts them, with the simulated kubelets of
//! `tensile-simkubelet`). What it is for and what it deliberately is not: docs/sim.md.
#![forbid(unsafe_code)]

pub mod apiserver;
