//! The status table of `tensile up` and `tensile status`: lower clusters with their nodes, each
//! virtual node, the upper cluster's pods and its recent events. Filled from watch caches (one
//! watch per resource per cluster), never from LISTs.

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tensile_core::summary::{NodeSummary, PodCounts, cluster_total, node_summaries, pod_counts};
use tokio_util::sync::CancellationToken;

/// Flags of `tensile status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Kubeconfig of the upper cluster (default: `KUBECONFIG`, which may list several files,
    /// else `~/.kube/config`, as kubectl reads them).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig (default: its current one).
    #[arg(long)]
    context: Option<String>,
    /// Print the table once, when the caches have synced, and exit.
    #[arg(long)]
    once: bool,
}

/// Events shown at the bottom of the table.
const RECENT_EVENTS: usize = 8;

/// Everything one drawing of the table shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Each lower cluster (when known: `tensile up`) with its nodes.
    pub lower: Vec<(String, Vec<NodeSummary>)>,
    /// The upper cluster's nodes.
    pub upper_nodes: Vec<NodeSummary>,
    /// The upper cluster's pods by phase.
    pub upper_pods: PodCounts,
    /// Recent events of the upper cluster, newest last.
    pub events: Vec<EventLine>,
}

/// One event, as shown.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventLine {
    /// `HH:MM:SS` (UTC) of its last occurrence.
    pub time: String,
    /// `Kind namespace/name` of the object.
    pub object: String,
    /// `Normal` or `Warning`.
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// Note (first line).
    pub note: String,
    /// Occurrences.
    pub count: i32,
}

/// Watch caches of the objects one cluster contributes to the table.
#[derive(Clone)]
pub struct ClusterCaches {
    nodes: Store<Node>,
    pods: Store<Pod>,
    events: Option<Store<Event>>,
}

impl ClusterCaches {
    /// Starts the watches of `client`'s nodes and pods (and events if `events`), until `stop`.
    pub fn start(client: &kube::Client, events: bool, stop: &CancellationToken) -> Self {
        Self {
            nodes: cache(Api::all(client.clone()), stop),
            pods: cache(Api::all(client.clone()), stop),
            events: events.then(|| cache(Api::all(client.clone()), stop)),
        }
    }

    /// Waits until every cache has its first list.
    pub async fn ready(&self) -> anyhow::Result<()> {
        self.nodes.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        if let Some(e) = &self.events {
            e.wait_until_ready().await?;
        }
        Ok(())
    }

    fn nodes(&self) -> Vec<NodeSummary> {
        let nodes = self.nodes.state();
        let pods = self.pods.state();
        node_summaries(nodes.iter().map(|n| &**n), pods.iter().map(|p| &**p))
    }
}

/// A reflector of `api` without managedFields (never shown), backing off like our other watches.
fn cache<K>(api: Api<K>, stop: &CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        tensile_runtime::backoff::watch(api, watcher::Config::default()),
    );
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                next = stream.next() => if next.is_none() { return },
            }
        }
    });
    store
}

/// The table's data now.
pub fn snapshot(upper: &ClusterCaches, lower: &[(String, ClusterCaches)]) -> Snapshot {
    let pods = upper.pods.state();
    Snapshot {
        lower: lower
            .iter()
            .map(|(name, c)| (name.clone(), c.nodes()))
            .collect(),
        upper_nodes: upper.nodes(),
        upper_pods: pod_counts(pods.iter().map(|p| &**p)),
        events: upper
            .events
            .as_ref()
            .map(|e| recent_events(&e.state()))
            .unwrap_or_default(),
    }
}

fn recent_events(events: &[std::sync::Arc<Event>]) -> Vec<EventLine> {
    let mut lines: Vec<(k8s_openapi::jiff::Timestamp, EventLine)> = events
        .iter()
        .filter_map(|e| {
            let when = e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
            let r = &e.involved_object;
            let object = format!(
                "{} {}{}",
                r.kind.as_deref().unwrap_or("?"),
                r.namespace
                    .as_deref()
                    .map(|n| format!("{n}/"))
                    .unwrap_or_default(),
                r.name.as_deref().unwrap_or("?"),
            );
            let line = EventLine {
                time: when.strftime("%H:%M:%S").to_string(),
                object,
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                note: e
                    .message
                    .as_deref()
                    .unwrap_or_default()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
                count: e
                    .series
                    .as_ref()
                    .and_then(|s| s.count)
                    .or(e.count)
                    .unwrap_or(1),
            };
            Some((when, line))
        })
        .collect();
    lines.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.object.cmp(&b.1.object)));
    let skip = lines.len().saturating_sub(RECENT_EVENTS);
    lines.into_iter().skip(skip).map(|(_, l)| l).collect()
}

/// CPU in cores with one decimal (`1.5`).
fn cores(nanos: i128) -> String {
    let tenths = nanos / 100_000_000;
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// Memory in GiB with one decimal.
fn gib(nanos: i128) -> String {
    let tenths = nanos / 1_000_000_000 * 10 / (1 << 30);
    format!("{}.{}Gi", tenths / 10, tenths % 10)
}

fn use_of(n: &NodeSummary, resource: &str, show: fn(i128) -> String) -> String {
    format!(
        "{}/{}",
        show(n.requested.get(resource)),
        show(n.allocatable.get(resource))
    )
}

fn pods_cell(p: &PodCounts) -> String {
    let mut s = format!("{} running", p.running);
    for (n, what) in [
        (p.pending, "pending"),
        (p.unscheduled, "unscheduled"),
        (p.succeeded, "succeeded"),
        (p.failed, "failed"),
        (p.unknown, "unknown"),
    ] {
        if n > 0 {
            let _ = write!(s, ", {n} {what}");
        }
    }
    s
}

fn node_state(n: &NodeSummary) -> String {
    let mut state = match (n.ready, n.cordoned) {
        (true, false) => "Ready",
        (true, true) => "Ready,Cordoned",
        (false, false) => "NotReady",
        (false, true) => "NotReady,Cordoned",
    }
    .to_owned();
    // Ready alone would hide an outage: the node stays Ready on purpose (nothing evicted).
    if n.lower_unreachable.is_some() {
        state.push_str(",LowerUnreachable");
    }
    if n.lower_errors.is_some() {
        state.push_str(",LowerErrors");
    }
    state
}

/// Lays out rows as columns two spaces apart.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<w$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// `first` cells, then a node's (or a cluster total's) status, CPU, memory and pods.
fn node_row(first: Vec<String>, n: &NodeSummary, status: &str) -> Vec<String> {
    let mut row = first;
    row.extend([
        status.to_owned(),
        use_of(n, "cpu", cores),
        use_of(n, "memory", gib),
        pods_cell(&n.pods),
    ]);
    row
}

/// The table as text.
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    if !s.lower.is_empty() {
        let mut rows = vec![
            [
                "LOWER CLUSTER",
                "NODE",
                "STATUS",
                "CPU req/alloc",
                "MEMORY req/alloc",
                "PODS",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for (cluster, nodes) in &s.lower {
            let total = cluster_total(nodes);
            let count = match nodes.len() {
                1 => "(1 node)".to_owned(),
                n => format!("({n} nodes)"),
            };
            let status = if total.ready { "Ready" } else { "NotReady" };
            rows.push(node_row(vec![cluster.clone(), count], &total, status));
            for n in nodes {
                rows.push(node_row(
                    vec![String::new(), n.name.clone()],
                    n,
                    &node_state(n),
                ));
            }
        }
        table(&mut out, &rows);
        out.push('\n');
    }
    let mut rows = vec![
        [
            "VIRTUAL NODE",
            "STATUS",
            "CPU req/alloc",
            "MEMORY req/alloc",
            "PODS",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    let virtual_nodes: Vec<&NodeSummary> =
        s.upper_nodes.iter().filter(|n| n.virtual_node).collect();
    for n in &virtual_nodes {
        rows.push(node_row(vec![n.name.clone()], n, &node_state(n)));
    }
    if virtual_nodes.is_empty() {
        rows.push(vec!["(none)".to_owned()]);
    }
    table(&mut out, &rows);
    for n in &virtual_nodes {
        if let Some(why) = &n.lower_unreachable {
            let _ = writeln!(out, "! {}: {why}", n.name);
        }
    }
    let offloaded: usize = virtual_nodes.iter().map(|n| n.pods.total()).sum();
    let p = &s.upper_pods;
    let _ = writeln!(
        out,
        "\nUPPER PODS  {} total: {} offloaded to virtual nodes, {} running, {} pending, {} not yet scheduled, {} failed",
        p.total(),
        offloaded,
        p.running,
        p.pending,
        p.unscheduled,
        p.failed
    );
    out.push_str("\nRECENT EVENTS\n");
    if s.events.is_empty() {
        out.push_str("(none)\n");
    } else {
        let rows: Vec<Vec<String>> = s
            .events
            .iter()
            .map(|e| {
                vec![
                    e.time.clone(),
                    e.type_.clone(),
                    e.reason.clone(),
                    e.object.clone(),
                    if e.count > 1 {
                        format!("{} (x{})", e.note, e.count)
                    } else {
                        e.note.clone()
                    },
                ]
            })
            .collect();
        table(&mut out, &rows);
    }
    out
}

/// Draws the table every second until `stop`: with a `header`, redrawn in place under it on a
/// terminal; otherwise (no header, or not a terminal) printed again each time it changes.
pub async fn show(
    header: Option<&str>,
    upper: &ClusterCaches,
    lower: &[(String, ClusterCaches)],
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let in_place = header.filter(|_| std::io::stdout().is_terminal());
    let mut last = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let text = render(&snapshot(upper, lower));
        if text == last {
            continue;
        }
        let mut out = std::io::stdout().lock();
        if let Some(header) = in_place {
            // Home, then clear to the end of the screen: redrawn in place.
            write!(out, "\x1b[H\x1b[J{header}\n\n{text}")?;
        } else {
            write!(out, "\n{text}")?;
        }
        out.flush()?;
        last = text;
    }
}

/// How long `tensile status` waits for the API server's first answer.
const FIRST_ANSWER: Duration = Duration::from_secs(5);

/// One question, with a deadline, before any watch starts: a server that does not answer is
/// one error naming its URL and the cause, not watches retrying (and logging) forever.
async fn reachable(client: &kube::Client, url: &str) -> anyhow::Result<()> {
    use tracing::instrument::WithSubscriber as _;
    // kube logs every failed connection itself; the error below says it once.
    let asked = tokio::time::timeout(FIRST_ANSWER, client.apiserver_version())
        .with_subscriber(tracing::subscriber::NoSubscriber::default())
        .await;
    match asked {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if tensile_node::reach::is_unreachable(&e) => anyhow::bail!(
            "cannot reach the API server at {url}: {}",
            tensile_node::reach::describe(&e).1
        ),
        Ok(Err(e)) => anyhow::bail!(
            "the API server at {url} refused: {}",
            tensile_node::reach::describe(&e).1
        ),
        Err(_) => anyhow::bail!(
            "cannot reach the API server at {url}: no answer within {} s",
            FIRST_ANSWER.as_secs()
        ),
    }
}

/// `tensile status`.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let kubeconfig = match &args.kubeconfig {
        Some(p) => kube::config::Kubeconfig::read_from(p)
            .with_context(|| format!("reading the kubeconfig {}", p.display()))?,
        None => kube::config::Kubeconfig::read().context("reading the default kubeconfig")?,
    };
    let options = kube::config::KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .context("loading the kubeconfig")?;
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("building the client")?;
    reachable(&client, &url).await?;
    let stop = CancellationToken::new();
    let upper = ClusterCaches::start(&client, true, &stop);
    tokio::time::timeout(Duration::from_secs(30), upper.ready())
        .await
        .with_context(|| format!("{url} did not answer the watches within 30 s"))??;
    if args.once {
        let mut out = std::io::stdout().lock();
        out.write_all(render(&snapshot(&upper, &[])).as_bytes())?;
        out.flush()?;
        stop.cancel();
        return Ok(());
    }
    let header = format!("tensile status · {url} · Ctrl-C to quit");
    tokio::select! {
        r = show(Some(&header), &upper, &[], &stop) => r,
        r = tokio::signal::ctrl_c() => { stop.cancel(); r.context("waiting for Ctrl-C") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, virtual_node: bool, cpu: (i128, i128), running: usize) -> NodeSummary {
        let mut n = NodeSummary {
            name: name.to_owned(),
            ready: true,
            virtual_node,
            ..NodeSummary::default()
        };
        n.allocatable.set("cpu", cpu.1 * 1_000_000_000);
        n.requested.set("cpu", cpu.0 * 100_000_000);
        n.allocatable.set("memory", 8 * (1 << 30) * 1_000_000_000);
        n.pods.running = running;
        n
    }

    #[test]
    fn the_table_shows_clusters_nodes_pods_and_events() {
        let s = Snapshot {
            lower: vec![(
                "lower-1".to_owned(),
                vec![node("lower-1-node-1", false, (15, 8), 3)],
            )],
            upper_nodes: vec![
                node("vk-lower-1", true, (15, 8), 3),
                node("real", false, (0, 4), 0),
            ],
            upper_pods: PodCounts {
                running: 3,
                unscheduled: 1,
                ..PodCounts::default()
            },
            events: vec![EventLine {
                time: "10:00:01".to_owned(),
                object: "Pod default/web-1".to_owned(),
                type_: "Normal".to_owned(),
                reason: "ProviderCreateSuccess".to_owned(),
                note: "created in the lower cluster".to_owned(),
                count: 2,
            }],
        };
        let text = render(&s);
        // Columns are padded: compare lines with single spaces.
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        for expected in [
            "lower-1 (1 node) Ready 1.5/8.0 0.0Gi/8.0Gi 3 running",
            "lower-1-node-1 Ready 1.5/8.0 0.0Gi/8.0Gi 3 running",
            "vk-lower-1 Ready 1.5/8.0 0.0Gi/8.0Gi 3 running",
            "UPPER PODS 4 total: 3 offloaded to virtual nodes, 3 running, 0 pending, 1 not yet scheduled, 0 failed",
            "10:00:01 Normal ProviderCreateSuccess Pod default/web-1 created in the lower cluster (x2)",
        ] {
            assert!(
                lines.iter().any(|l| l == expected),
                "{expected:?} in\n{text}"
            );
        }
        assert!(
            !lines.iter().any(|l| l.starts_with("real")),
            "only virtual nodes: {text}"
        );
    }

    #[test]
    fn an_unreachable_lower_cluster_shows_in_the_table() {
        let mut down = node("vk-lower-1", true, (1, 8), 2);
        down.lower_unreachable =
            Some("lower cluster lower-1 unreachable: connection refused".to_owned());
        let text = render(&Snapshot {
            upper_nodes: vec![down, node("vk-lower-2", true, (1, 8), 1)],
            ..Snapshot::default()
        });
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        for expected in [
            "vk-lower-1 Ready,LowerUnreachable 0.1/8.0 0.0Gi/8.0Gi 2 running",
            "! vk-lower-1: lower cluster lower-1 unreachable: connection refused",
            "vk-lower-2 Ready 0.1/8.0 0.0Gi/8.0Gi 1 running",
        ] {
            assert!(
                lines.iter().any(|l| l == expected),
                "{expected:?} in\n{text}"
            );
        }
    }

    #[test]
    fn empty_cluster_says_so() {
        let text = render(&Snapshot::default());
        assert!(text.contains("(none)"), "{text}");
        assert!(!text.contains("LOWER CLUSTER"), "{text}");
    }

    #[test]
    fn quantities_are_shown_in_cores_and_gib() {
        assert_eq!(cores(1_500_000_000), "1.5");
        assert_eq!(cores(250_000_000), "0.2");
        assert_eq!(gib(3 * (1 << 29) * 1_000_000_000), "1.5Gi");
    }
}
