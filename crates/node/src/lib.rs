//! The virtual node: one lower cluster registered as one Node of the upper cluster. Node
//! registration, status and lease; the pod sync controller; dependency reflectors; the capacity
//! tracker; and the kubelet backend that forwards to the lower cluster.
//!
//! Built in issues 5 and 6 on top of `tensile-core`.
#![forbid(unsafe_code)]

pub mod clients;
pub mod lower_backend;
pub mod node;
pub mod pods;
mod queue;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Everything a virtual node runs, wired together.
#[derive(Debug)]
pub struct VirtualNode {
    /// The node loop settings.
    pub node: node::NodeLoop,
    /// The pod controller settings.
    pub pods: pods::PodSync,
}

impl VirtualNode {
    /// Runs the capacity tracker, the node loop and the pod controller until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let (tx, rx) = watch::channel(Default::default());
        let lower = self.pods.lower.clone();
        let upper = self.pods.upper.clone();
        let capacity = tokio::spawn(node::track_capacity(
            lower.clone(),
            self.node.owner.clone(),
            tx,
            stop.clone(),
        ));
        let node_loop = tokio::spawn(node::run_node(upper, lower, self.node, rx, stop.clone()));
        let pods = tokio::spawn(pods::run(self.pods, stop));
        let _ = tokio::join!(capacity, node_loop, pods);
    }
}
