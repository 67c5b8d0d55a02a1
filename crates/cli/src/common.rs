//! What the component subcommands share: Go duration flags, where the upper cluster's
//! kubeconfig comes from, clients, serving certificates.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tensile_node::clients::{ApiCalls, KubeconfigSource, build_client};
use tensile_placement::serve::ServingCert;

/// A Go duration flag (`90s`, `3m`, `1h30m`), positive.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d: k8s_openapi::jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    match Duration::try_from(d) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("invalid duration {text:?}: must be positive")),
    }
}

/// The upper cluster's kubeconfig, in kube's own order: the given path (which must load), else
/// `~/.kube/config` if it exists, else the in-cluster configuration.
pub fn upper_source(path: Option<&PathBuf>) -> KubeconfigSource {
    if let Some(p) = path {
        return KubeconfigSource::Path(p.clone());
    }
    match std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")) {
        Some(p) if p.exists() => KubeconfigSource::Path(p),
        _ => KubeconfigSource::InCluster,
    }
}

/// A client of `source` limited to `qps`/`burst`, its API calls counted under `cluster` in a
/// registry of its own (the components that use this serve no metrics).
pub async fn client(
    source: KubeconfigSource,
    qps: f32,
    burst: u32,
    cluster: &'static str,
) -> anyhow::Result<kube::Client> {
    let mut registry = prometheus_client::registry::Registry::default();
    let calls = ApiCalls::new(&mut registry);
    build_client(source.clone(), qps, burst, cluster, &calls)
        .await
        .with_context(|| format!("{cluster} cluster client from {source}"))
}

/// The serving certificate of a component: the given files (`flags` names them), or a
/// generated CA and certificate for `sans` when neither is given.
pub fn serving_cert(
    cert: Option<&PathBuf>,
    key: Option<&PathBuf>,
    flags: (&str, &str),
    common_name: &str,
    sans: &[String],
) -> anyhow::Result<ServingCert> {
    Ok(match (cert, key) {
        (Some(c), Some(k)) => ServingCert::from_files(c, k)?,
        (None, None) => ServingCert::generate(common_name, sans)?,
        _ => anyhow::bail!("{} and {} go together", flags.0, flags.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
