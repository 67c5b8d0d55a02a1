//! Real nodes for a real test cluster: kubelet 1.34 with its own containerd, runc, the CNI
//! plugins of Debian's containernetworking-plugins and kube-proxy in iptables mode, each node in
//! a network namespace of its own, as a host of its own would be. Two nodes on one machine share
//! nothing: not the containerd (root, state and socket are the node's), the kubelet's root
//! directory, its ports, the cgroup root of its pods, nor the iptables kube-proxy writes.
//!
//! The network, all in 198.18.0.0/15 and never leaving the machine: node `K` (a slot taken
//! machine-wide, 1..=250) lives in netns `tensile-node-K`, whose pod bridge `cni0` holds the
//! node address `198.18.K.1/24` and hands its pods `198.18.K.2-254`. Its `eth0` is one end of a
//! veth pair whose other end sits in the test host's namespace ([`testhost::NETNS`]), which
//! routes between nodes (forwarding is on there, never on the host). The host reaches every
//! node, and nodes reach the host's [`testhost::ADDRESS`] (where the API servers of clusters
//! with real nodes listen), through the test host's veth pair. So pods of two lower clusters
//! reach each other by IP, as tensile-kube's flat network needs.
//!
//! Needs root (network namespaces, cgroups, mounts, containerd), Debian's `containerd`,
//! `runc`, `containernetworking-plugins`, `iptables`, iproute2 and util-linux's `nsenter`, and
//! in the binaries folder `kubelet`, `kube-proxy` and the image archives of
//! `scripts/node-images` (`images/`), which `scripts/k8s-bin` builds. docs/testing.md says
//! what each of these is for.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::certs::{Ca, CertError};

use crate::testhost;

/// The pause image the node's containerd runs as every pod's sandbox (imported, not pulled).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// The cluster DNS Service address every real node's pods use (kubelet `clusterDNS`).
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
/// The Service range of real control planes (`--service-cluster-ip-range`).
pub const SERVICE_RANGE: &str = "198.19.0.0/16";
/// The first address of [`SERVICE_RANGE`]: the `kubernetes` Service.
pub const KUBERNETES_SERVICE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// Where the CNI plugins of Debian's containernetworking-plugins are.
const CNI_BIN: &str = "/usr/lib/cni";
/// Where slots are taken: one lock file a slot, held for the node's life.
const SLOTS: &str = "/run/tensile-real-nodes";
const LAST_SLOT: u8 = 250;

/// A real node could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RealNodeError {
    /// Not root.
    #[error(
        "real nodes need root (network namespaces, cgroups, mounts and containerd); this process runs as uid {uid}"
    )]
    NotRoot {
        /// The effective user.
        uid: String,
    },
    /// A program or file is missing.
    #[error("real nodes need {what}, not found ({hint})")]
    Missing {
        /// What.
        what: String,
        /// Where it comes from.
        hint: &'static str,
    },
    /// A set-up command failed.
    #[error("real node {node}: `{command}`: {detail}")]
    Command {
        /// Which node.
        node: String,
        /// The command.
        command: String,
        /// What it said.
        detail: String,
    },
    /// A file could not be written or read.
    #[error("real node {node}: {path}: {source}")]
    Io {
        /// Which node.
        node: String,
        /// Which file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Every slot is taken.
    #[error("real node {node}: all {LAST_SLOT} node slots of this machine are taken ({SLOTS})")]
    NoSlot {
        /// Which node.
        node: String,
    },
    /// Certificates could not be made.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// A process did not come up.
    #[error("real node {node}: {what} not ready after {seconds} s (log: {log})")]
    NotReady {
        /// Which node.
        node: String,
        /// What.
        what: &'static str,
        /// How long it was given.
        seconds: u64,
        /// Its log.
        log: PathBuf,
    },
}

/// What a real node needs from its cluster.
#[derive(Debug)]
pub struct NodeConfig<'a> {
    /// The folder holding `kubelet`, `kube-proxy` and `images/`.
    pub bin: &'a Path,
    /// The folder the node's files go into (a folder of its own is made in it).
    pub parent: &'a Path,
    /// The node's name.
    pub name: &'a str,
    /// The cluster's API server, reachable from the node's namespace.
    pub api: SocketAddr,
    /// The cluster CA (signs the node's client and serving certificates, verifies clients).
    pub ca: &'a Ca,
}

/// A running real node; stopped and cleaned up (processes, containers, mounts, cgroups,
/// namespace, route, files) on drop.
#[derive(Debug)]
pub struct RealNode {
    /// The node's name.
    pub name: String,
    /// Its address (InternalIP): where its kubelet listens.
    pub address: Ipv4Addr,
    /// Its pods' range.
    pub pod_cidr: String,
    /// Its folder (configs, logs, the kubelet's root, containerd's root and state).
    pub dir: PathBuf,
    /// containerd's socket, for `ctr --address`.
    pub containerd_socket: PathBuf,
    slot: u8,
    children: Vec<Child>,
    /// The registry its containerd pulls from (the imported images).
    registry: Option<crate::registry::Registry>,
    /// Its files and logs stay when it is dropped (it failed to come up).
    keep_files: bool,
    /// Held for the node's life: the slot is this process's.
    _lock: std::fs::File,
}

impl RealNode {
    /// Keeps the node's files and logs when it is dropped, for whoever looks into why it did
    /// not come up.
    pub fn keep_files(&mut self) {
        self.keep_files = true;
    }

    /// The node's network namespace.
    pub fn netns(&self) -> String {
        netns(self.slot)
    }
}

fn netns(slot: u8) -> String {
    format!("tensile-node-{slot}")
}
fn cgroup_root(slot: u8) -> String {
    format!("tensile-node-{slot}")
}
fn fabric_link(slot: u8) -> String {
    format!("tensile-n{slot}")
}
fn node_subnet(slot: u8) -> String {
    format!("198.18.{slot}.0/24")
}

impl Drop for RealNode {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        let keep = self.keep_files || std::thread::panicking();
        teardown(self.slot, Some(&self.dir), keep);
    }
}

/// Starts a real node: its namespace and network, cgroup root, containerd with the images
/// imported, kubelet and kube-proxy. Its registration is the caller's to wait for.
pub async fn start(config: NodeConfig<'_>) -> Result<RealNode, RealNodeError> {
    let node = config.name.to_owned();
    preflight(config.bin)?;
    inotify_room(&node)?;
    let (slot, lock) = take_slot(&node)?;
    let dir = config.parent.join(config.name);
    // Recorded for whoever finds the slot left behind by a killed process.
    write_file(
        &node,
        &Path::new(SLOTS).join(format!("{slot}.dir")),
        &dir.display().to_string(),
    )?;
    let address = Ipv4Addr::new(198, 18, slot, 1);
    let mut started = RealNode {
        name: node.clone(),
        address,
        pod_cidr: node_subnet(slot),
        containerd_socket: dir.join("containerd/containerd.sock"),
        dir: dir.clone(),
        slot,
        children: Vec::new(),
        registry: None,
        keep_files: false,
        _lock: lock,
    };
    for sub in [
        "containerd/root",
        "containerd/state",
        "cni/conf",
        "cni/ipam",
        "kubelet",
        "kubelet/pki",
        "pod-logs",
        "volume-plugins",
    ] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(|source| RealNodeError::Io {
            node: node.clone(),
            path,
            source,
        })?;
    }
    network(&node, slot)?;
    cgroups(&node, slot)?;
    let registry = crate::registry::start(
        &config.bin.join("images"),
        &dir.join("registry"),
        SocketAddr::new(testhost::ADDRESS.into(), 0),
    )
    .await
    .map_err(|e| RealNodeError::Command {
        node: node.clone(),
        command: "the image registry".into(),
        detail: e.to_string(),
    })?;
    let registry_addr = registry.addr;
    started.registry = Some(registry);
    let files = write_configs(&config, &started, registry_addr)?;

    let ctr_log = dir.join("containerd.log");
    let containerd = spawn_in(
        &node,
        slot,
        Path::new("containerd"),
        &["--config".into(), s(&files.containerd)],
        &ctr_log,
    )?;
    started.children.push(containerd);
    wait_for(&node, "containerd", &ctr_log, 60, || {
        let socket = started.containerd_socket.clone();
        async move { std::os::unix::net::UnixStream::connect(&socket).is_ok() }
    })
    .await?;
    import_images(&node, config.bin, &started.containerd_socket)?;

    let kubelet_log = dir.join("kubelet.log");
    let kubelet = spawn_in(
        &node,
        slot,
        &config.bin.join("kubelet"),
        &[
            format!("--config={}", s(&files.kubelet)),
            format!("--kubeconfig={}", s(&files.kubelet_kubeconfig)),
            format!("--root-dir={}", s(&dir.join("kubelet"))),
            format!("--cert-dir={}", s(&dir.join("kubelet/pki"))),
            format!("--node-ip={address}"),
            format!("--hostname-override={}", config.name),
            "--v=2".into(),
        ],
        &kubelet_log,
    )?;
    started.children.push(kubelet);
    let proxy_log = dir.join("kube-proxy.log");
    let proxy = spawn_in(
        &node,
        slot,
        &config.bin.join("kube-proxy"),
        &[format!("--config={}", s(&files.proxy)), "--v=2".into()],
        &proxy_log,
    )?;
    started.children.push(proxy);
    Ok(started)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn root() -> Result<(), RealNodeError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // "Uid: real effective saved fs"
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .unwrap_or("unknown")
        .to_owned();
    if uid == "0" {
        Ok(())
    } else {
        Err(RealNodeError::NotRoot { uid })
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Whether this machine and `bin` have what a real node needs (root, the programs, the
/// binaries and images), said before anything starts.
pub fn preflight(bin: &Path) -> Result<(), RealNodeError> {
    root()?;
    let missing = |what: String, hint| RealNodeError::Missing { what, hint };
    for (program, package) in [
        ("containerd", "Debian package containerd"),
        ("containerd-shim-runc-v2", "Debian package containerd"),
        ("ctr", "Debian package containerd"),
        ("runc", "Debian package runc"),
        ("iptables", "Debian package iptables"),
        ("nsenter", "Debian package util-linux"),
        ("ip", "Debian package iproute2"),
    ] {
        if !on_path(program) {
            return Err(missing(format!("{program} on the PATH"), package));
        }
    }
    for plugin in ["bridge", "host-local", "loopback", "portmap"] {
        if !Path::new(CNI_BIN).join(plugin).is_file() {
            return Err(missing(
                format!("CNI plugin {CNI_BIN}/{plugin}"),
                "Debian package containernetworking-plugins",
            ));
        }
    }
    for binary in ["kubelet", "kube-proxy", "images/images.txt"] {
        if !bin.join(binary).is_file() {
            return Err(missing(
                format!("{}", bin.join(binary).display()),
                "scripts/k8s-bin builds it",
            ));
        }
    }
    match testhost::address() {
        Ok(a) if a == testhost::ADDRESS => Ok(()),
        Ok(other) => Err(missing(
            format!(
                "the test host's own veth pair ({} set to {other})",
                testhost::ADDRESS_ENV
            ),
            "real nodes route through the test host's namespace: unset it",
        )),
        Err(e) => Err(missing(
            format!("the test host's veth pair ({e})"),
            "made with iproute2's `ip`, as root",
        )),
    }
}

fn run(node: &str, program: &str, args: &[&str]) -> Result<String, RealNodeError> {
    let command = || format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RealNodeError::Command {
            node: node.to_owned(),
            command: command(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(RealNodeError::Command {
            node: node.to_owned(),
            command: command(),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn write_file(node: &str, path: &Path, text: &str) -> Result<(), RealNodeError> {
    crate::secret_file::write_secret(path, text).map_err(|source| RealNodeError::Io {
        node: node.to_owned(),
        path: path.to_owned(),
        source,
    })
}

/// The inotify instances every real node needs room for: each kubelet (cAdvisor), containerd and
/// control plane holds several, all of root's, and the kernel's default of 128 runs out with a
/// few test clusters at once (the kubelet then fails to start cAdvisor: `inotify_init: too many
/// open files`, and never registers).
const INOTIFY_INSTANCES: u64 = 1024;
const INOTIFY_SYSCTL: &str = "/proc/sys/fs/inotify/max_user_instances";

/// Raises `fs.inotify.max_user_instances` to [`INOTIFY_INSTANCES`] when it is lower, as kind
/// asks of the hosts of its node containers; never lowers it.
fn inotify_room(node: &str) -> Result<(), RealNodeError> {
    let io = |source| RealNodeError::Io {
        node: node.to_owned(),
        path: INOTIFY_SYSCTL.into(),
        source,
    };
    let now: u64 = std::fs::read_to_string(INOTIFY_SYSCTL)
        .map_err(io)?
        .trim()
        .parse()
        .unwrap_or(0);
    if now < INOTIFY_INSTANCES {
        tracing::info!(
            from = now,
            to = INOTIFY_INSTANCES,
            "raising fs.inotify.max_user_instances for real nodes"
        );
        std::fs::write(INOTIFY_SYSCTL, INOTIFY_INSTANCES.to_string()).map_err(io)?;
    }
    Ok(())
}

/// Takes the first free slot; a slot left by a killed process is cleaned first.
fn take_slot(node: &str) -> Result<(u8, std::fs::File), RealNodeError> {
    let io = |path: PathBuf| {
        let node = node.to_owned();
        move |source| RealNodeError::Io { node, path, source }
    };
    std::fs::create_dir_all(SLOTS).map_err(io(SLOTS.into()))?;
    let mut taken = None;
    for slot in 1..=LAST_SLOT {
        let path = Path::new(SLOTS).join(format!("{slot}.lock"));
        let left = Path::new(SLOTS).join(format!("{slot}.dir"));
        // Past the first free slot, only the ones a killed process left are looked at.
        if taken.is_some() && !left.exists() {
            continue;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(path.clone()))?;
        if file.try_lock().is_err() {
            continue;
        }
        // Free, yet recorded: its node's process was killed. What it left goes now.
        let left = std::fs::read_to_string(&left).ok().map(PathBuf::from);
        teardown(slot, left.as_deref(), false);
        if taken.is_none() {
            taken = Some((slot, file));
        }
    }
    taken.ok_or_else(|| RealNodeError::NoSlot {
        node: node.to_owned(),
    })
}

/// The node's namespace, its veth pair into the test host's namespace, the pod bridge with
/// the node address, and the routes both ways.
fn network(node: &str, slot: u8) -> Result<(), RealNodeError> {
    let ns = netns(slot);
    let fabric = testhost::NETNS;
    let link = fabric_link(slot);
    let subnet = node_subnet(slot);
    let address = format!("198.18.{slot}.1");
    let ip = |args: &[&str]| run(node, "ip", args);
    ip(&["netns", "add", &ns])?;
    ip(&[
        "-n", fabric, "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &ns,
    ])?;
    ip(&["-n", fabric, "link", "set", &link, "up"])?;
    ip(&[
        "-n", fabric, "route", "replace", &subnet, "via", &address, "dev", &link, "onlink",
    ])?;
    ip(&["-n", &ns, "link", "set", "lo", "up"])?;
    ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
    ip(&["-n", &ns, "link", "add", "cni0", "type", "bridge"])?;
    ip(&[
        "-n",
        &ns,
        "addr",
        "add",
        &format!("{address}/24"),
        "dev",
        "cni0",
    ])?;
    ip(&["-n", &ns, "link", "set", "cni0", "up"])?;
    let gateway = testhost_peer();
    ip(&[
        "-n", &ns, "route", "add", "default", "via", &gateway, "dev", "eth0", "onlink",
    ])?;
    // The host reaches the node through the test host's namespace.
    ip(&["route", "replace", &subnet, "via", &gateway])?;
    // Forwarding in the test host's namespace (between nodes) and in the node's own (to its
    // pods); bridged pod traffic through iptables, as kube-proxy needs for a Service whose
    // backend is on the same bridge. All three are the namespaces' own settings, not the host's.
    run(
        node,
        "ip",
        &[
            "netns",
            "exec",
            fabric,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
    )?;
    run(
        node,
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.bridge.bridge-nf-call-iptables=1",
        ],
    )?;
    Ok(())
}

/// The test host namespace's end of its veth pair: the nodes' gateway.
fn testhost_peer() -> String {
    let a = testhost::ADDRESS.octets();
    Ipv4Addr::new(a[0], a[1], a[2], a[3] + 1).to_string()
}

/// The cgroup v1 and v2 mount points of this machine.
fn cgroup_mounts() -> Vec<(PathBuf, bool)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let point = left.split_whitespace().nth(4)?;
            match fstype {
                "cgroup" => Some((PathBuf::from(point), false)),
                "cgroup2" => Some((PathBuf::from(point), true)),
                _ => None,
            }
        })
        .collect()
}

/// The node's cgroup root in every hierarchy, made before the kubelet starts (it checks that
/// it exists); cpuset's needs its CPUs and memory nodes copied from the parent.
fn cgroups(node: &str, slot: u8) -> Result<(), RealNodeError> {
    for (mount, _) in cgroup_mounts() {
        let dir = mount.join(cgroup_root(slot));
        if let Err(source) = std::fs::create_dir_all(&dir) {
            return Err(RealNodeError::Io {
                node: node.to_owned(),
                path: dir,
                source,
            });
        }
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(mount.join(file)) {
                std::fs::write(dir.join(file), value.trim()).map_err(|source| {
                    RealNodeError::Io {
                        node: node.to_owned(),
                        path: dir.join(file),
                        source,
                    }
                })?;
            }
        }
    }
    Ok(())
}

struct ConfigFiles {
    containerd: PathBuf,
    kubelet: PathBuf,
    kubelet_kubeconfig: PathBuf,
    proxy: PathBuf,
}

fn kubeconfig_for(
    api: SocketAddr,
    ca: &Ca,
    user: &str,
    group: Option<&str>,
) -> Result<String, CertError> {
    let issued = ca.issue_client(user, group)?;
    Ok(tensile_sim::apiserver::kubeconfig(&[
        tensile_sim::apiserver::KubeconfigEntry {
            context: "node".into(),
            server: format!("https://{api}"),
            ca_pem: ca.cert_pem().to_owned(),
            client: Some(issued),
            token: None,
        },
    ]))
}

fn write_configs(
    config: &NodeConfig<'_>,
    n: &RealNode,
    registry: SocketAddr,
) -> Result<ConfigFiles, RealNodeError> {
    let node = config.name;
    let dir = &n.dir;
    let w = |name: &str, text: &str| -> Result<PathBuf, RealNodeError> {
        let path = dir.join(name);
        write_file(node, &path, text)?;
        Ok(path)
    };
    let containerd = w(
        "containerd.toml",
        &format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine's root lacks CAP_SYS_RESOURCE: a negative oom_score_adj is refused.
  restrict_oom_score_adj = true
  # Pod network namespaces under the node's own state, not /var/run/netns.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state of this node's containers, not the machine-wide /run/containerd/runc.
        Root = "{state}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{dir}/cni/conf"
  # Every registry is mirrored by the one serving the imported images (crate::registry).
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."*"]
    endpoint = ["http://{registry}"]
"#,
            root = s(&dir.join("containerd/root")),
            state = s(&dir.join("containerd/state")),
            socket = s(&n.containerd_socket),
            dir = s(dir),
        ),
    )?;
    w(
        "cni/conf/10-tensile.conflist",
        &serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "tensile",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": s(&dir.join("cni/ipam")),
                        "ranges": [[{"subnet": n.pod_cidr, "gateway": n.address.to_string()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        })
        .to_string(),
    )?;
    let serving = config
        .ca
        .issue_server(node, &[n.address.to_string(), node.to_owned()])?;
    let tls_crt = w("kubelet/pki/kubelet.crt", &serving.cert_pem)?;
    let tls_key = w("kubelet/pki/kubelet.key", &serving.key_pem)?;
    let ca = w("ca.crt", config.ca.cert_pem())?;
    let resolv = w("resolv.conf", &format!("nameserver {CLUSTER_DNS}\n"))?;
    let kubelet_kubeconfig = w(
        "kubelet.kubeconfig",
        &kubeconfig_for(
            config.api,
            config.ca,
            &format!("system:node:{node}"),
            Some("system:nodes"),
        )?,
    )?;
    let kubelet = w(
        "kubelet.yaml",
        &serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": n.address.to_string(),
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "tlsCertFile": s(&tls_crt),
            "tlsPrivateKeyFile": s(&tls_key),
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": s(&ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": format!("unix://{}", s(&n.containerd_socket)),
            // cgroup v1 here, and containerd 1.6 cannot tell the kubelet its driver.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", cgroup_root(n.slot)),
            "failSwapOn": false,
            "clusterDNS": [CLUSTER_DNS.to_string()],
            "clusterDomain": "cluster.local",
            "resolvConf": s(&resolv),
            // The imported images are the only ones there are: never collected.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            // A small test disk must not evict the tests' pods.
            "evictionHard": {
                "memory.available": "1%",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "podLogsDir": s(&dir.join("pod-logs")),
            "volumePluginDir": s(&dir.join("volume-plugins")),
            "podCIDR": n.pod_cidr,
            "serializeImagePulls": false,
            "rotateCertificates": false,
            "serverTLSBootstrap": false,
            // Its own namespace: chains of its own, gone with it.
            "makeIPTablesUtilChains": true,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "nodeStatusReportFrequency": "1m",
        })
        .to_string(),
    )?;
    let proxy_kubeconfig = w(
        "kube-proxy.kubeconfig",
        &kubeconfig_for(config.api, config.ca, "system:kube-proxy", None)?,
    )?;
    let proxy = w(
        "kube-proxy.yaml",
        &serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "hostnameOverride": node,
            "bindAddress": n.address.to_string(),
            "clientConnection": {"kubeconfig": s(&proxy_kubeconfig)},
            "clusterCIDR": "198.18.0.0/16",
            "detectLocalMode": "ClusterCIDR",
            "metricsBindAddress": "127.0.0.1:10249",
            "healthzBindAddress": "127.0.0.1:10256",
            // The host's conntrack table size and timeouts are not the node's to change.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": false, "syncPeriod": "10s", "minSyncPeriod": "0s"},
            "oomScoreAdj": 0,
        })
        .to_string(),
    )?;
    Ok(ConfigFiles {
        containerd,
        kubelet,
        kubelet_kubeconfig,
        proxy,
    })
}

/// Starts `program` inside the node's network namespace only (not its mount namespace, which
/// the kubelet, containerd and runc must share with each other and with the host: the
/// volumes the kubelet mounts are what runc bind-mounts into containers).
fn spawn_in(
    node: &str,
    slot: u8,
    program: &Path,
    args: &[String],
    log: &Path,
) -> Result<Child, RealNodeError> {
    let io = |source| RealNodeError::Io {
        node: node.to_owned(),
        path: log.to_owned(),
        source,
    };
    let out = std::fs::File::create(log).map_err(io)?;
    let err = out.try_clone().map_err(io)?;
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", netns(slot)))
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| RealNodeError::Command {
            node: node.to_owned(),
            command: format!("nsenter ... {}", program.display()),
            detail: e.to_string(),
        })
}

async fn wait_for<F, Fut>(
    node: &str,
    what: &'static str,
    log: &Path,
    seconds: u64,
    mut ready: F,
) -> Result<(), RealNodeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while !ready().await {
        if tokio::time::Instant::now() >= deadline {
            return Err(RealNodeError::NotReady {
                node: node.to_owned(),
                what,
                seconds,
                log: log.to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Imports every archive `images/images.txt` lists into the node's containerd, under the
/// names the kubelet will ask for (`k8s.io` is the CRI's namespace).
fn import_images(node: &str, bin: &Path, socket: &Path) -> Result<(), RealNodeError> {
    let images = bin.join("images");
    let list = images.join("images.txt");
    let text = std::fs::read_to_string(&list).map_err(|source| RealNodeError::Io {
        node: node.to_owned(),
        path: list.clone(),
        source,
    })?;
    for archive in text.lines().filter_map(|l| l.split_whitespace().next()) {
        run(
            node,
            "ctr",
            &[
                "--address",
                &s(socket),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                &s(&images.join(archive)),
            ],
        )?;
    }
    Ok(())
}

/// Every process id in the node's cgroup root, in every hierarchy, and in its namespace.
fn node_pids(slot: u8) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(procs.lines().map(str::to_owned));
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut pids = Vec::new();
    for (mount, _) in cgroup_mounts() {
        walk(&mount.join(cgroup_root(slot)), &mut pids);
    }
    if let Ok(out) = Command::new("ip")
        .args(["netns", "pids", &netns(slot)])
        .stderr(Stdio::null())
        .output()
    {
        pids.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned),
        );
    }
    pids.sort();
    pids.dedup();
    pids.retain(|p| !p.is_empty());
    pids
}

/// The mount points under `dir`, deepest first (`/proc/self/mountinfo` escapes spaces).
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = s(dir);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    points
}

/// Leaves nothing of slot `slot` behind: every process of the node (kubelet, containerd and
/// its shims, kube-proxy, the containers, which outlive a killed shim), then its mounts, its
/// cgroups, its namespace (its veth pair and iptables go with it), the host's route and, but
/// for a failed test's, its files.
fn teardown(slot: u8, dir: Option<&Path>, keep_files: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let pids = node_pids(slot);
        if pids.is_empty() || std::time::Instant::now() >= deadline {
            break;
        }
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(&pids)
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Some(dir) = dir {
        forget_cni_results(dir);
        for point in mounts_under(dir) {
            let _ = Command::new("umount")
                .args(["-l", &point])
                .stderr(Stdio::null())
                .status();
        }
    }
    for (mount, _) in cgroup_mounts() {
        remove_cgroup_tree(&mount.join(cgroup_root(slot)));
    }
    let _ = Command::new("ip")
        .args(["netns", "del", &netns(slot)])
        .stderr(Stdio::null())
        .status();
    let _ = Command::new("ip")
        .args(["route", "del", &node_subnet(slot)])
        .stderr(Stdio::null())
        .status();
    if let Some(dir) = dir {
        if keep_files {
            #[allow(clippy::print_stderr)] // the one place a failed test's reader will look
            {
                eprintln!("real node files and logs kept in {}", dir.display());
            }
        } else if mounts_under(dir).is_empty() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    let _ = std::fs::remove_file(Path::new(SLOTS).join(format!("{slot}.dir")));
}

/// The CNI library caches each pod sandbox's network result machine-wide, in
/// `/var/lib/cni/results`, until the sandbox's network is torn down; the node's sandboxes were
/// killed instead, so their entries go here.
fn forget_cni_results(dir: &Path) {
    let sandboxes = dir.join("containerd/root/io.containerd.grpc.v1.cri/sandboxes");
    let ids: Vec<String> = std::fs::read_dir(sandboxes)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    if ids.is_empty() {
        return;
    }
    let results = Path::new("/var/lib/cni/results");
    for entry in std::fs::read_dir(results).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if ids.iter().any(|id| name.contains(id.as_str())) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The CoreDNS image `scripts/node-images` imports (what kubeadm 1.34 installs).
pub const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.12.1";

/// Installs cluster DNS as kubeadm does: CoreDNS as a Deployment in `kube-system` behind the
/// Service `kube-dns` at [`CLUSTER_DNS`], with its ServiceAccount, RBAC and Corefile (no
/// `forward`: nothing upstream is reachable from here). Idempotent.
pub async fn install_cluster_dns(client: &kube::Client) -> Result<(), kube::Error> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let labels = serde_json::json!({"k8s-app": "kube-dns"});
    let corefile = ".:53 {\n    errors\n    health {\n       lameduck 5s\n    }\n    ready\n    \
        kubernetes cluster.local in-addr.arpa ip6.arpa {\n       pods insecure\n       \
        fallthrough in-addr.arpa ip6.arpa\n       ttl 30\n    }\n    prometheus :9153\n    \
        cache 30\n    loop\n    reload\n    loadbalance\n}\n";
    let ns = "kube-system";
    create(
        kube::Api::<ServiceAccount>::namespaced(client.clone(), ns),
        serde_json::json!({"metadata": {"name": "coredns", "namespace": ns}}),
    )
    .await?;
    create(
        kube::Api::<ClusterRole>::all(client.clone()),
        serde_json::json!({
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        }),
    )
    .await?;
    create(
        kube::Api::<ClusterRoleBinding>::all(client.clone()),
        serde_json::json!({
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": ns}],
        }),
    )
    .await?;
    create(
        kube::Api::<ConfigMap>::namespaced(client.clone(), ns),
        serde_json::json!({"metadata": {"name": "coredns", "namespace": ns}, "data": {"Corefile": corefile}}),
    )
    .await?;
    create(
        kube::Api::<Service>::namespaced(client.clone(), ns),
        serde_json::json!({
            "metadata": {"name": "kube-dns", "namespace": ns, "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
            "spec": {
                "selector": labels,
                "clusterIP": CLUSTER_DNS.to_string(),
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                    {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
                ],
            },
        }),
    )
    .await?;
    create(
        kube::Api::<Deployment>::namespaced(client.clone(), ns),
        serde_json::json!({
            "metadata": {"name": "coredns", "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        "dnsPolicy": "Default",
                        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                        "volumes": [{"name": "config-volume", "configMap": {"name": "coredns", "items": [{"key": "Corefile", "path": "Corefile"}]}}],
                        "containers": [{
                            "name": "coredns",
                            "image": COREDNS_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true}],
                            "ports": [
                                {"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                                {"containerPort": 9153, "name": "metrics", "protocol": "TCP"},
                            ],
                            "resources": {"requests": {"cpu": "10m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}},
                            "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "initialDelaySeconds": 60, "timeoutSeconds": 5, "failureThreshold": 5},
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}},
                        }],
                    },
                },
            },
        }),
    )
    .await?;
    Ok(())
}

/// Creates `object`, or leaves the one of that name alone.
async fn create<K>(api: kube::Api<K>, object: serde_json::Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
    match api.create(&kube::api::PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
