//! `tensile descheduler`: moves pods their virtual node's lower cluster cannot place (see
//! `tensile_placement::descheduler`), accepting the original's flags and policy file.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use k8s_openapi::jiff::SignedDuration;
use serde_json::Value;
use tensile_core::deschedule::Policy;
use tensile_core::keys::{LABEL_NODE_TYPE, VALUE_NODE_TYPE_VIRTUAL};
use tensile_placement::descheduler::{DeschedulerConfig, run as run_descheduler};
use tensile_placement::metrics::DeschedulerMetrics;
use tokio_util::sync::CancellationToken;

use crate::common::{client, upper_source};
use tensile_core::duration::parse_duration;

/// Flags of `tensile descheduler`.
#[derive(Debug, Args)]
pub struct DeschedulerArgs {
    /// Upper-cluster kubeconfig. Default: ~/.kube/config if it exists, else in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// How long a pod may be Unschedulable in its lower cluster before it moves.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub unschedulable_threshold: Duration,
    /// Also move pods Pending on a virtual node longer than this (the original's PodLifeTime
    /// rule; off by default).
    #[arg(long, value_parser = parse_duration)]
    pub max_pod_life_time: Option<Duration>,
    /// The original's policy file (descheduler/v1alpha1 DeschedulerPolicy); its PodLifeTime
    /// `maxPodLifeTimeSeconds` sets --max-pod-life-time.
    #[arg(long)]
    pub policy_config_file: Option<PathBuf>,
    /// Log what would move; write nothing.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub dry_run: bool,
    /// Only virtual nodes matching this label selector too.
    #[arg(long, default_value = "")]
    pub node_selector: String,
    /// Moves per virtual node per minute (0: unlimited).
    #[arg(long, default_value_t = 0)]
    pub max_pods_to_evict_per_node: u32,
    /// Move pods with emptyDir or hostPath volumes (their data is lost).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub evict_local_storage_pods: bool,
    /// Moves of one pod after which the descheduler gives up (with a Warning event).
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Moves per second over all nodes.
    #[arg(long, default_value_t = 10.0)]
    pub moves_per_second: f64,
    /// Burst of --moves-per-second.
    #[arg(long, default_value_t = 20)]
    pub moves_burst: u32,
    /// Namespace of move intents and exclusion records (default: $POD_NAMESPACE, else
    /// kube-system); the webhook's --exclusions-namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub namespace: String,
    /// How long a workload stays off a virtual node one of its pods was moved away from (Go
    /// duration).
    #[arg(long, default_value = "3m", value_parser = tensile_core::duration::parse_duration)]
    pub exclusion_window: Duration,
    /// Accepted for compatibility: the descheduler is event driven, not periodic.
    #[arg(long = "descheduling-interval", alias = "descheduling_interval")]
    pub descheduling_interval: Option<String>,
    /// klog verbosity (accepted; use RUST_LOG).
    #[arg(long = "v")]
    pub verbosity: Option<u8>,
    #[command(flatten)]
    pub leader: crate::common::LeaderElectArgs,
    #[command(flatten)]
    pub metrics: crate::common::MetricsArgs,
}

/// `maxPodLifeTimeSeconds` of an enabled PodLifeTime strategy, from the policy's YAML.
fn policy_max_age(text: &str) -> anyhow::Result<Option<Duration>> {
    let policy: Value = serde_saphyr::from_str(text).context("the policy is not YAML")?;
    if policy.get("kind").and_then(Value::as_str) != Some("DeschedulerPolicy") {
        bail!("the policy is not a DeschedulerPolicy");
    }
    let Some(strategy) = policy.pointer("/strategies/PodLifeTime") else {
        return Ok(None);
    };
    if strategy.get("enabled").and_then(Value::as_bool) == Some(false) {
        return Ok(None);
    }
    Ok(strategy
        .pointer("/params/maxPodLifeTimeSeconds")
        .and_then(Value::as_u64)
        .map(Duration::from_secs))
}

fn signed(d: Duration) -> anyhow::Result<SignedDuration> {
    SignedDuration::try_from(d).context("duration out of range")
}

/// The library configuration from the flags.
pub fn config(args: &DeschedulerArgs) -> anyhow::Result<DeschedulerConfig> {
    let mut max_age = args.max_pod_life_time;
    if let Some(path) = &args.policy_config_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --policy-config-file {}", path.display()))?;
        if max_age.is_none() {
            max_age = policy_max_age(&text)
                .with_context(|| format!("--policy-config-file {}", path.display()))?;
        }
    }
    let mut selector = format!("{LABEL_NODE_TYPE}={VALUE_NODE_TYPE_VIRTUAL}");
    if !args.node_selector.trim().is_empty() {
        selector = format!("{selector},{}", args.node_selector.trim());
    }
    if args.moves_per_second.is_nan() || args.moves_per_second <= 0.0 {
        bail!("--moves-per-second must be positive");
    }
    Ok(DeschedulerConfig {
        policy: Policy {
            unschedulable_for: signed(args.unschedulable_threshold)?,
            max_pending_age: max_age.map(signed).transpose()?,
            evict_local_storage: args.evict_local_storage_pods,
            max_attempts: args.max_attempts,
        },
        dry_run: args.dry_run,
        node_selector: selector,
        max_per_node_per_minute: args.max_pods_to_evict_per_node,
        moves_per_second: args.moves_per_second,
        burst: args.moves_burst,
        namespace: args.namespace.clone(),
        exclusion_window: args.exclusion_window,
        ..DeschedulerConfig::default()
    })
}

pub async fn run(args: DeschedulerArgs) -> anyhow::Result<()> {
    if args.descheduling_interval.is_some() {
        tracing::warn!(
            "--descheduling-interval is accepted for compatibility: pods are looked at when they change"
        );
    }
    let mut config = config(&args)?;
    let client = client(upper_source(args.kubeconfig.as_ref()), 100.0, 200, "upper").await?;
    // Served from the start, so that a standby answers its probes (`/readyz` 503).
    let probes = CancellationToken::new();
    let mut registry = prometheus_client::registry::Registry::default();
    config.metrics = DeschedulerMetrics::new(&mut registry);
    let gauge = tensile_runtime::leader::LeaderGauge::new(
        &mut registry,
        &args.leader.lease("tensile-descheduler"),
    );
    let (readiness, _) =
        crate::common::serve_metrics(&args.metrics, args.leader.leader_elect, registry, &probes)
            .await?;
    config.readiness = Some(readiness.clone());
    // A new leader carries on the move intents the old one left (they are in ConfigMaps).
    let leadership = crate::common::lead(
        &args.leader,
        &client,
        "tensile-descheduler",
        "descheduler",
        &gauge,
    )
    .await?;
    if matches!(leadership, crate::common::Leadership::Stopped) {
        return Ok(());
    }
    // Ready once its watches have listed (`run` sets it).
    readiness.set_not_ready("starting: listing pods, nodes and move intents");
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_descheduler(config, client, stop.clone()));
    crate::common::run_until_stopped(
        leadership,
        stop,
        async {
            let _ = task.await;
        },
        Duration::from_secs(5),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_originals_policy_file_sets_the_age_rule() {
        let text = r#"
apiVersion: "descheduler/v1alpha1"
kind: "DeschedulerPolicy"
strategies:
  "PodLifeTime":
     enabled: true
     params:
        maxPodLifeTimeSeconds: 180
"#;
        assert_eq!(
            policy_max_age(text).unwrap(),
            Some(Duration::from_secs(180))
        );
        assert!(policy_max_age("kind: Other").is_err());
        assert_eq!(
            policy_max_age("kind: DeschedulerPolicy\nstrategies: {}").unwrap(),
            None
        );
    }
}
