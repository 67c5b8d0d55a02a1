//! `tensile`: every component of tensile-kube as a subcommand of one binary.
#![forbid(unsafe_code)]

mod bench;
mod sim;
mod status;
mod up;
mod virtual_node;

use clap::{Parser, Subcommand};

/// Run one Kubernetes cluster on top of many.
#[derive(Debug, Parser)]
#[command(name = "tensile", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The sandbox: an upper and lower clusters in this process, a virtual node for each lower
    /// cluster, one kubeconfig, a live status table.
    Up(up::UpArgs),
    /// The status table (virtual nodes, pods, recent events) of an upper cluster.
    Status(status::StatusArgs),
    /// Run one simulated cluster (embedded API server) in the foreground.
    Sim(sim::SimArgs),
    /// Benchmarks (`tensile bench offload`).
    Bench(bench::BenchArgs),
    /// Register a lower cluster as one node of the upper cluster and run its pods there.
    VirtualNode(Box<virtual_node::VirtualNodeArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Up(args) => up::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Sim(args) => sim::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::VirtualNode(args) => virtual_node::run(*args).await,
        }
    })
}
