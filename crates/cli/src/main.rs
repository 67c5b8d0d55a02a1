//! `tensile`: every component of tensile-kube as a subcommand of one binary.
#![forbid(unsafe_code)]

mod common;
mod descheduler;
mod heap;
mod join;
mod logging;
mod scheduler;
#[cfg(feature = "sandbox")]
mod sim;
mod status;
#[cfg(feature = "sandbox")]
mod up;
mod virtual_node;
mod webhook;

use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc, not glibc's malloc: it gives back within seconds what a burst freed, where glibc
/// keeps it in per-thread arenas for good (a virtual node with 2,000 pods: 87 against 148 MiB
/// once the burst is over), and spends less CPU on the same work (docs/benchmarks.md, "Where
/// the node's memory goes").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Run one Kubernetes cluster on top of many.
#[derive(Debug, Parser)]
#[command(name = "tensile", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format: `text`, or `json` (one object per line, Kubernetes' field names: `ts`,
    /// `caller`, `msg`, `v`, then the event's key/values).
    #[arg(long, global = true, value_enum, default_value = "text")]
    logging_format: logging::LoggingFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The sandbox: an upper and lower clusters in this process, a virtual node for each lower
    /// cluster, one kubeconfig, a live status table.
    #[cfg(feature = "sandbox")]
    Up(up::UpArgs),
    /// The status table (virtual nodes, pods, recent events) of an upper cluster.
    Status(status::StatusArgs),
    /// Run one simulated cluster (embedded API server) in the foreground.
    #[cfg(feature = "sandbox")]
    Sim(sim::SimArgs),
    /// Benchmarks (`tensile bench offload`).
    #[cfg(feature = "sandbox")]
    Bench(tensile_bench::BenchArgs),
    /// Register a lower cluster as one node of the upper cluster and run its pods there.
    VirtualNode(Box<virtual_node::VirtualNodeArgs>),
    /// The mutating admission webhook: moves a virtual pod's scheduling constraints into its
    /// `clusterSelector` annotation.
    Webhook(Box<webhook::WebhookArgs>),
    /// Moves pods that their virtual node's lower cluster cannot place.
    Descheduler(Box<descheduler::DeschedulerArgs>),
    /// The kube-scheduler extender: filters and scores virtual nodes by their lower clusters'
    /// real nodes and reserves room when it binds.
    Scheduler(Box<scheduler::SchedulerArgs>),
    /// Add a lower cluster: its identity and token downstairs, the Secret and the virtual node
    /// upstairs (contexts of your kubeconfig).
    Join(Box<join::JoinArgs>),
    /// Remove a lower cluster joined with `tensile join`, once its node runs no pods.
    Unjoin(Box<join::UnjoinArgs>),
}

/// Resolves on SIGINT or SIGTERM (what Kubernetes sends a container it stops).
pub(crate) async fn shutdown_signal() -> anyhow::Result<()> {
    use anyhow::Context as _;
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT"),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")
    }
}

fn main() -> ExitCode {
    let cli = parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match cli.logging_format {
        logging::LoggingFormat::Text => logs.with_ansi(colour(&std::io::stderr())).init(),
        logging::LoggingFormat::Json => logs.event_format(logging::KubeJson).init(),
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Returning the error from main would print its Debug form instead, which carries a
            // backtrace whenever RUST_BACKTRACE is set.
            let _ = writeln!(std::io::stderr(), "error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The command line. Installed as `kubectl-tensile`, the binary is a kubectl plugin (`kubectl
/// tensile status`, kubectl's convention: a `kubectl-<name>` file on the PATH) and its help and
/// errors name it so.
fn parse() -> Cli {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let plugin = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|name| name.starts_with("kubectl-"));
    let mut command = Cli::command();
    if plugin {
        command = command.bin_name("kubectl tensile");
    }
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

/// The error and its causes on one line, `a: b: c`, as anyhow's `{:#}`, but a cause is left out
/// when the message before already ends with it: many errors (kube's among them) repeat their
/// source in their own message.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Colour only for a person at a terminal: files and pipes get plain text, and `NO_COLOR`
/// (set and not empty, as no-color.org says) turns it off.
fn colour(stream: &impl IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn run(command: Command) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match command {
            #[cfg(feature = "sandbox")]
            Command::Up(args) => up::run(args).await,
            Command::Status(args) => status::run(args).await,
            #[cfg(feature = "sandbox")]
            Command::Sim(args) => sim::run(args).await,
            #[cfg(feature = "sandbox")]
            // Stopped by a signal, the benchmark returns: dropping it (and the runtime its
            // tasks run on) kills the clusters and components it started.
            Command::Bench(args) => tokio::select! {
                r = tensile_bench::run(args, virtual_node::start_in_sandbox) => r,
                r = shutdown_signal() => {
                    r?;
                    anyhow::bail!("stopped by a signal: the benchmark's processes are stopped too")
                }
            },
            Command::VirtualNode(args) => virtual_node::run(*args).await,
            Command::Webhook(args) => webhook::run(*args).await,
            Command::Descheduler(args) => descheduler::run(*args).await,
            Command::Scheduler(args) => scheduler::run(*args).await,
            Command::Join(args) => join::run_join(*args).await,
            Command::Unjoin(args) => join::run_unjoin(*args).await,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_one_line_with_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(io)
            .context("cannot read kubeconfig k: no such file")
            .context("upper cluster client");
        assert_eq!(
            one_line(&e),
            "upper cluster client: cannot read kubeconfig k: no such file"
        );
        assert_eq!(one_line(&anyhow::anyhow!("a").context("b")), "b: a");
    }
}
