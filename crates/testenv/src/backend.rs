//! What serves a cluster's API: the simulator in this process, or a real control plane from
//! binaries. [`crate::TestEnv`]'s clusters and the sandbox's (`tensile up`) are both one.

use std::net::SocketAddr;
use std::path::Path;

use tensile_sim::apiserver::controllers::SchedulerExtender;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig, KubeconfigEntry};

use crate::real::{self, RealCluster, RealOptions};
use crate::{SchedulerConfigError, TestEnvError, certs};

/// What serves a cluster's API.
#[derive(Debug)]
pub enum Backend {
    /// The simulator, in this process, and the CA of its certificates.
    Sim(ApiServer, Box<certs::Ca>),
    /// Real binaries; kept for its lifetime: dropping it stops the control plane.
    Real(Box<RealCluster>),
}

/// Which backend [`Backend::start`] starts, and how.
#[derive(Debug)]
pub enum BackendSpec<'a> {
    /// The simulator, so configured.
    Sim(Box<ApiServerConfig>),
    /// The binaries in `bin`, their files and logs in a folder of `dir`.
    Real {
        /// The folder of the binaries (`scripts/k8s-bin`'s).
        bin: &'a Path,
        /// Where the control plane's folder goes.
        dir: &'a Path,
        /// Its settings.
        options: RealOptions,
    },
}

impl Backend {
    /// Starts the control plane of cluster `name` (a simulated one is named by its
    /// configuration), the simulator's with the certificates of a new cluster CA
    /// ([`crate::start_apiserver`]).
    pub async fn start(name: &str, spec: BackendSpec<'_>) -> Result<Self, TestEnvError> {
        match spec {
            BackendSpec::Sim(config) => {
                let (server, ca) = crate::start_apiserver(*config).await?;
                Ok(Self::Sim(server, Box::new(ca)))
            }
            BackendSpec::Real { bin, dir, options } => real::start_with(bin, dir, name, &options)
                .await
                .map(|r| Self::Real(Box::new(r)))
                .map_err(|source| TestEnvError::Real {
                    cluster: name.to_owned(),
                    source,
                }),
        }
    }

    /// Whether real control-plane binaries serve it.
    pub fn is_real(&self) -> bool {
        matches!(self, Self::Real(_))
    }

    /// Where its API server listens.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::Sim(s, _) => s.addr(),
            Self::Real(r) => r.api_addr,
        }
    }

    /// The administrator's kubeconfig entry, under `context`, straight to the API server.
    pub fn entry(&self, context: &str) -> KubeconfigEntry {
        match self {
            Self::Sim(s, _) => s.kubeconfig_entry(context),
            Self::Real(r) => KubeconfigEntry {
                context: context.to_owned(),
                ..r.entry.clone()
            },
        }
    }

    /// The cluster CA certificate (PEM): what signs its API server's serving certificate and
    /// the client certificate it presents to kubelets.
    pub fn ca_pem(&self) -> &str {
        match self {
            Self::Sim(_, ca) => ca.cert_pem(),
            Self::Real(r) => &r.ca_pem,
        }
    }

    /// Runs the cluster's scheduler with a KubeSchedulerConfiguration (as JSON, e.g. a file of
    /// `deploy/` read as YAML): a real kube-scheduler is restarted with it as it is (the
    /// harness sets only its client connection and leader election) and waited for; the
    /// simulated scheduler takes its `extenders` at once, read as kube-scheduler reads them.
    pub async fn set_scheduler_config(
        &self,
        config: &serde_json::Value,
    ) -> Result<(), SchedulerConfigError> {
        match self {
            Self::Sim(s, _) => {
                let extenders = SchedulerExtender::from_scheduler_config(config)
                    .map_err(SchedulerConfigError::Invalid)?;
                s.set_scheduler_extenders(extenders);
                Ok(())
            }
            Self::Real(r) => r
                .restart_scheduler(config)
                .await
                .map_err(SchedulerConfigError::Real),
        }
    }

    /// Stops a simulated API server now; a real control plane stops when dropped.
    pub fn stop(&self) {
        if let Self::Sim(s, _) = self {
            s.stop();
        }
    }
}
