//! The benchmarks of `tensile bench ...` and the sandbox they share with `tensile up`: an upper
//! cluster and lower ones (simulated, or real control planes), virtual nodes and the placement
//! components wired in. Test and workstation support: the `tensile` binary links it only with
//! its `sandbox` feature, never in the image.
//!
//! Each benchmark is a module of its own with its flags (`clap::Args`) and its `run`; what they
//! share is in `support`. The in-process virtual node of the sandbox is the binary's assembly
//! of `tensile virtual-node`, which a library cannot reach: the binary hands it in
//! ([`sandbox::StartVirtualNode`]).
//!
//! Errors are `anyhow`'s here, as in the binary: they end on the terminal of whoever runs the
//! benchmark or the sandbox, and no caller matches on them.
#![forbid(unsafe_code)]

mod chaos;
mod chaos_check;
mod chaos_plan;
mod conformance;
mod extender;
mod failover;
mod faults;
mod fragmentation;
mod hostile;
mod node_scale;
mod offload;
mod plot;
mod real_offload;
pub mod sandbox;
mod support;

/// `tensile bench ...`
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: Bench,
}

#[derive(Debug, clap::Subcommand)]
enum Bench {
    /// Pods created at once upstairs, bound to one virtual node, run in the lower cluster.
    Offload(offload::OffloadArgs),
    /// One virtual node carrying many pods, created bound by Deployments, through a burst, a
    /// steady stretch of token refreshes, a kill -9 and restart, a rolling change and the
    /// deletion of everything: its memory, CPU, requests and stage latencies per phase.
    NodeScale(node_scale::NodeScaleArgs),
    /// Three lower clusters with fragmented free room and a burst of mixed-size pods, with and
    /// without the descheduler and the scheduler extender.
    Fragmentation(fragmentation::FragmentationArgs),
    /// The scheduler extender's decisions alone, in this process, on the fragmentation
    /// benchmark's fleet: filter, prioritize and bind latency and CPU, without HTTP or API
    /// servers.
    Extender(extender::ExtenderBenchArgs),
    /// Two virtual-node replicas with --leader-elect; the leader is killed in the middle of a
    /// burst: takeover time, and no pod lost, duplicated or deleted.
    Failover(failover::FailoverArgs),
    /// Faults of the control planes (API servers killed or stopped, etcd killed, the network
    /// cut, API errors) in the middle of a burst: no pod lost, duplicated, deleted or evicted,
    /// the node Ready again soon after, the outage shown while it lasts.
    Faults(faults::FaultsArgs),
    /// A randomized fault run: two lower clusters, their virtual nodes as two replicas each,
    /// the placement components, churn the whole time, and faults of a schedule drawn from the
    /// seed, overlapping; an invariant checker reads both clusters' watches.
    Chaos(chaos::ChaosArgs),
    /// The webhook and the scheduler extender, as shipped, sent large hostile bodies in
    /// parallel: their peak memory.
    HostileBodies(hostile::HostileBodiesArgs),
    /// Kubernetes' conformance suite (e2e.test) through the virtual nodes, on real control
    /// planes and real nodes, beside the same selection on one lower cluster directly.
    Conformance(conformance::ConformanceArgs),
    /// The same pods directly in a lower cluster with a real node and upstairs through its
    /// virtual node: what the virtual node adds to create-to-Running on real containers.
    RealOffload(real_offload::RealOffloadArgs),
}

/// Runs the benchmark `args` names. `start_virtual_node` runs a virtual node in this process,
/// for the sandbox of the benchmarks that have one in-process (`conformance`).
pub async fn run(
    args: BenchArgs,
    start_virtual_node: sandbox::StartVirtualNode,
) -> anyhow::Result<()> {
    match args.what {
        Bench::Offload(a) => offload::run(a).await,
        Bench::NodeScale(a) => node_scale::run(a).await,
        Bench::Fragmentation(a) => fragmentation::run(a).await,
        Bench::Extender(a) => extender::run(a).await,
        Bench::Failover(a) => failover::run(a).await,
        Bench::Faults(a) => faults::run(a).await,
        Bench::Chaos(a) => chaos::run(a).await,
        Bench::HostileBodies(a) => hostile::run(a).await,
        Bench::Conformance(a) => conformance::run(a, start_virtual_node).await,
        Bench::RealOffload(a) => real_offload::run(a).await,
    }
}
