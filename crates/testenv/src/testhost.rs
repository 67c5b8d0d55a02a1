//! A non-loopback address on this machine for the simulated kubelets of a `TestEnv`.
//!
//! A real API server refuses to proxy `nodes/proxy` to a loopback or link-local address
//! (`400 address not allowed`), and so does the simulator. Simulated kubelets therefore listen
//! on [`ADDRESS`], the host end of a veth pair whose other end lives in a network namespace of
//! our own ([`NETNS`]): traffic to it never leaves the machine. 198.18.0.0/15 is the range set
//! aside for network benchmarks (RFC 2544), so it collides with no real network.
//!
//! Making the pair needs root and iproute2's `ip`; it is made once per machine and kept (the
//! next test process finds it). `TENSILE_TEST_HOST_ADDRESS` names another address of this
//! machine to use instead, for machines where someone else prepared one.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::sync::OnceLock;

/// The address simulated kubelets listen on.
pub const ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The peer end's address, inside [`NETNS`].
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The network namespace holding the veth pair's peer end.
pub const NETNS: &str = "tensile-testhost";
const HOST_LINK: &str = "tensile-th0";
const PEER_LINK: &str = "tensile-th1";
/// The environment variable naming an address to use instead.
pub const ADDRESS_ENV: &str = "TENSILE_TEST_HOST_ADDRESS";

/// No non-loopback address could be had.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "simulated kubelets need a non-loopback address (API servers refuse nodes/proxy to loopback): \
     {reason}; run the tests as root with iproute2's `ip` on the PATH so they can make the veth \
     pair {HOST_LINK}/{PEER_LINK} ({ADDRESS}, netns {NETNS}), or set {ADDRESS_ENV} to an address \
     of this machine"
)]
pub struct TestHostError {
    /// What failed.
    pub reason: String,
}

/// The address to give simulated kubelets, made on first use.
pub fn address() -> Result<Ipv4Addr, TestHostError> {
    static ADDR: OnceLock<Result<Ipv4Addr, TestHostError>> = OnceLock::new();
    ADDR.get_or_init(|| {
        if let Some(given) = std::env::var_os(ADDRESS_ENV).filter(|v| !v.is_empty()) {
            let given = given.to_string_lossy();
            let ip: Ipv4Addr = given.parse().map_err(|e| TestHostError {
                reason: format!("{ADDRESS_ENV}={given:?}: {e}"),
            })?;
            return bindable(ip).map(|()| ip);
        }
        if bindable(ADDRESS).is_ok() {
            return Ok(ADDRESS);
        }
        make_pair()?;
        bindable(ADDRESS).map(|()| ADDRESS)
    })
    .clone()
}

/// The `n`-th extra address of this machine beside [`address`], for a virtual node of its own:
/// each virtual node of a deployment has its own address (its pod's), and what it serves on
/// it (node ports) is its own. `198.18.0.(16 + n)/32` on the pair's host end, routed to from
/// its other end (where the real nodes' namespaces send what is not theirs); with
/// `TENSILE_TEST_HOST_ADDRESS` set, that address (shared).
pub fn extra_address(n: u8) -> Result<Ipv4Addr, TestHostError> {
    let base = address()?;
    if base != ADDRESS {
        return Ok(base);
    }
    let extra = Ipv4Addr::new(198, 18, 0, 16u8.saturating_add(n));
    let _lock = machine_lock()?;
    if bindable(extra).is_err() {
        ip(&["addr", "add", &format!("{extra}/32"), "dev", HOST_LINK])?;
    }
    // The real nodes' namespaces reach the host through the pair's other end, which knows
    // only the pair's /30 on its own.
    ip(&[
        "-n",
        NETNS,
        "route",
        "replace",
        &format!("{extra}/32"),
        "dev",
        PEER_LINK,
    ])?;
    bindable(extra).map(|()| extra)
}

fn machine_lock() -> Result<std::fs::File, TestHostError> {
    let lock_path = std::env::temp_dir().join("tensile-testhost.lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| TestHostError {
        reason: format!("lock file {}: {e}", lock_path.display()),
    })?;
    lock.lock().map_err(|e| TestHostError {
        reason: format!("locking {}: {e}", lock_path.display()),
    })?;
    Ok(lock)
}

fn bindable(ip: Ipv4Addr) -> Result<(), TestHostError> {
    TcpListener::bind((ip, 0))
        .map(drop)
        .map_err(|e| TestHostError {
            reason: format!("cannot listen on {ip}: {e}"),
        })
}

/// Makes the namespace and the pair under a machine-wide lock: the test processes nextest
/// runs side by side would otherwise race on it.
fn make_pair() -> Result<(), TestHostError> {
    let _lock = machine_lock()?;
    // Another process may have finished it while this one waited for the lock.
    if bindable(ADDRESS).is_ok() {
        return Ok(());
    }
    let peer = format!("{PEER}/30");
    let host = format!("{ADDRESS}/30");
    // Each step tolerates what an earlier, interrupted run left behind.
    let has_netns = ip(&["netns", "list"])?
        .lines()
        .any(|l| l.split_whitespace().next() == Some(NETNS));
    if !has_netns {
        ip(&["netns", "add", NETNS])?;
    }
    if ip(&["link", "show", HOST_LINK]).is_err() {
        ip(&[
            "link", "add", HOST_LINK, "type", "veth", "peer", "name", PEER_LINK, "netns", NETNS,
        ])?;
    }
    if !ip(&["-o", "addr", "show", "dev", HOST_LINK])?.contains(&host) {
        ip(&["addr", "add", &host, "dev", HOST_LINK])?;
    }
    ip(&["link", "set", HOST_LINK, "up"])?;
    if !ip(&["-n", NETNS, "-o", "addr", "show", "dev", PEER_LINK])?.contains(&peer) {
        ip(&["-n", NETNS, "addr", "add", &peer, "dev", PEER_LINK])?;
    }
    ip(&["-n", NETNS, "link", "set", PEER_LINK, "up"])?;
    Ok(())
}

fn ip(args: &[&str]) -> Result<String, TestHostError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| TestHostError {
            reason: format!("running `ip`: {e}"),
        })?;
    if !out.status.success() {
        return Err(TestHostError {
            reason: format!(
                "`ip {}`: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
