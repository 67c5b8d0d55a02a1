//! Child `tensile` processes of the benchmarks and the sandbox, and what `/proc` says about a
//! process (Linux only: elsewhere the figures are NaN).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// A free TCP port on loopback for a child to listen on (see [`tensile_testenv::free_port`]).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(tensile_testenv::free_port()?)
}

/// Starts `binary <args>` (a `tensile` binary), quiet but for warnings, its log in `log`;
/// killed when dropped.
pub fn spawn(binary: &Path, args: &[String], log: &Path) -> anyhow::Result<tokio::process::Child> {
    tokio::process::Command::new(binary)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} {}", binary.display(), args.join(" ")))
}

/// Polls `check` every 100 ms until it says yes; after `within`, an error saying what was
/// waited for, with the log of the process waited on.
pub async fn poll_until<F, Fut>(
    what: &str,
    log: &Path,
    within: Duration,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        if Instant::now() > deadline {
            bail!(
                "{what}: not within {within:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Waits until `addr` accepts connections (the server listens once ready), up to `within`.
pub async fn listening(addr: SocketAddr, log: &Path, within: Duration) -> anyhow::Result<()> {
    poll_until(&format!("{addr} listening"), log, within, || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await
}

/// A process's memory from `/proc/<pid>/status`: (current RSS, peak RSS `VmHWM`) in MiB.
pub fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user + system, all threads) a process has used, in seconds, from
/// `/proc/<pid>/stat` (Linux counts it in USER_HZ ticks, 100 per second on every architecture
/// Rust's std supports there).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

/// CPU time the whole machine has spent busy (every state but idle and iowait, all cores), in
/// seconds, from `/proc/stat`.
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|t| t.parse().ok())
        .collect();
    if ticks.len() < 8 {
        return f64::NAN;
    }
    (ticks.iter().sum::<f64>() - ticks[3] - ticks[4]) / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let (rss, peak) = memory_mib(std::process::id());
        assert!(rss > 0.0 && peak >= rss, "rss {rss} peak {peak}");
        assert!(cpu_seconds(std::process::id()) >= 0.0);
        assert!(machine_busy_seconds() > 0.0);
        assert!(memory_mib(u32::MAX).0.is_nan());
        assert!(cpu_seconds(u32::MAX).is_nan());
    }
}
