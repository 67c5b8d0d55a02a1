//! The virtual node: one lower cluster registered as one Node of the upper cluster. Node
//! registration, status and lease; the pod sync controller; dependency reflectors; the capacity
//! tracker; and the kubelet backend that forwards to the lower cluster.
//!
//! Built in issues 5 and 6 on top of `tensile-core`.
#![forbid(unsafe_code)]

pub mod clients;
pub mod lower_backend;
