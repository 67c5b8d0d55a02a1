//! `tensile`: every component of tensile-kube as a subcommand of one binary.
#![forbid(unsafe_code)]

use clap::Parser;

/// Run one Kubernetes cluster on top of many.
///
/// The components (virtual-node, webhook, descheduler, scheduler, sim, up) arrive as
/// subcommands issue by issue; see the README for what exists today.
#[derive(Debug, Parser)]
#[command(name = "tensile", version, about, long_about = None)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
