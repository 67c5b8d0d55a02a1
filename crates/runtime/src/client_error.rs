//! Why building a Kubernetes client failed (`crate::clients`, `crate::transport`).

use std::path::PathBuf;

use kube::config::{InClusterError, KubeconfigError};

/// Building a client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read (missing, unreadable, a directory).
    #[error("cannot read kubeconfig {}: {source}", path.display())]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig file was read but is not a usable kubeconfig.
    #[error("invalid kubeconfig {}: {source}", path.display())]
    InvalidKubeconfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: KubeconfigError,
    },
    /// Kubeconfig text given inline is not a usable kubeconfig.
    #[error("invalid kubeconfig text: {0}")]
    InvalidKubeconfigText(#[source] KubeconfigError),
    /// In-cluster configuration was asked for but is not available.
    #[error("in-cluster configuration is not available: {0}")]
    InCluster(#[source] InClusterError),
    /// The API server URL override is not a URL.
    #[error("invalid API server URL {url:?}: {reason}")]
    InvalidServerUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The kubeconfig's `tls-server-name` is not a DNS name or an IP address.
    #[error("invalid tls-server-name {name:?} for the {cluster} cluster")]
    InvalidServerName {
        /// The cluster (`upper` or `lower`).
        cluster: &'static str,
        /// The name as given.
        name: String,
    },
    /// The kubeconfig names a proxy, which our clients do not support.
    #[error("the {cluster} cluster's kubeconfig names a proxy ({url}), which is not supported")]
    Proxy {
        /// The cluster (`upper` or `lower`).
        cluster: &'static str,
        /// The proxy URL.
        url: String,
    },
    /// kube could not build the client from the configuration (TLS material, credential, ...).
    #[error("cannot build the {cluster} cluster client: {source}")]
    Build {
        /// The cluster (`upper` or `lower`).
        cluster: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
}
