//! Lower namespaces made to exist before anything is created in them, shared by every
//! controller of one virtual node, so a burst of pods or Services in a new namespace asks the
//! lower API server once, not once per object. A namespace we create carries the upper
//! namespace's Pod Security labels, so the lower cluster admits offloaded pods at the level the
//! upper one did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use tensile_core::deps::{lower_namespace_of, namespace_gone};
use tokio::sync::OnceCell;

use tensile_runtime::clients::already_exists;

/// Why a lower namespace could not be made to exist.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The upper namespace (its Pod Security labels) could not be read.
    #[error(
        "reading namespace {name} in the upper cluster (for its pod-security labels): {source}"
    )]
    Upper {
        /// The namespace.
        name: String,
        /// The upper API server's answer.
        #[source]
        source: kube::Error,
    },
    /// The lower API server refused the creation.
    #[error("creating namespace {name} in the lower cluster: {source}")]
    Lower {
        /// The namespace.
        name: String,
        /// The lower API server's answer.
        #[source]
        source: kube::Error,
    },
}

/// The lower namespaces known to exist.
pub struct LowerNamespaces {
    upper: kube::Client,
    lower: kube::Client,
    owner: String,
    known: Mutex<HashMap<String, Arc<OnceCell<()>>>>,
}

impl std::fmt::Debug for LowerNamespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LowerNamespaces")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl LowerNamespaces {
    /// For the lower cluster of `lower`, namespaces created carry the marks of node `owner` and
    /// the Pod Security labels of their namesakes in the cluster of `upper`.
    pub fn new(upper: kube::Client, lower: kube::Client, owner: String) -> Self {
        LowerNamespaces {
            upper,
            lower,
            owner,
            known: Mutex::default(),
        }
    }

    /// Creates namespace `name` in the lower cluster unless it is known to exist (an existing
    /// one, ours or not, is used as it is). Concurrent callers for one namespace wait for the
    /// first one's answer.
    pub async fn ensure(&self, name: &str) -> Result<(), NamespaceError> {
        let once = match self.known.lock() {
            Ok(mut known) => known.entry(name.to_owned()).or_default().clone(),
            // A panicked holder left the map as it was: a fresh cell only costs one request.
            Err(poisoned) => poisoned
                .into_inner()
                .entry(name.to_owned())
                .or_default()
                .clone(),
        };
        once.get_or_try_init(|| async {
            // Never weaker than upstairs: a namespace whose labels cannot be read is not created
            // (one already gone upstairs has none to give).
            let upper = Api::<Namespace>::all(self.upper.clone())
                .get_opt(name)
                .await
                .map_err(|source| NamespaceError::Upper {
                    name: name.to_owned(),
                    source,
                })?;
            let namespace = lower_namespace_of(name, &self.owner, upper.as_ref());
            match Api::<Namespace>::all(self.lower.clone())
                .create(&PostParams::default(), &namespace)
                .await
            {
                Err(e) if !already_exists(&e) => Err(NamespaceError::Lower {
                    name: name.to_owned(),
                    source: e,
                }),
                _ => Ok(()),
            }
        })
        .await
        .map(|_| ())
    }

    /// Forgets namespace `name` when `error`, the failure of a creation in it, says the
    /// namespace is missing or being deleted ([`namespace_gone`]): the next creation in it makes
    /// it again. Any other failure leaves it known (forgetting on every failure created the
    /// namespace again after each failed pod of a burst).
    pub fn forget_if_gone(&self, name: &str, error: &(dyn std::error::Error + 'static)) {
        let mut next = Some(error);
        while let Some(e) = next {
            // Some errors keep the client's error boxed: a link of its own type.
            let api = e
                .downcast_ref::<kube::Error>()
                .or_else(|| e.downcast_ref::<Box<kube::Error>>().map(AsRef::as_ref));
            if let Some(kube::Error::Api(status)) = api {
                let details = status.details.as_ref();
                let causes: Vec<&str> = details
                    .map(|d| d.causes.iter().map(|c| c.reason.as_str()).collect())
                    .unwrap_or_default();
                let kind = details.map(|d| d.kind.as_str()).unwrap_or_default();
                if namespace_gone(status.code, kind, &causes, &status.message) {
                    self.forget(name);
                }
                return;
            }
            next = e.source();
        }
    }

    /// Forgets namespace `name`.
    fn forget(&self, name: &str) {
        let mut known = match self.known.lock() {
            Ok(known) => known,
            Err(poisoned) => poisoned.into_inner(),
        };
        known.remove(name);
    }
}
