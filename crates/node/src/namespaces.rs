//! Lower namespaces made to exist before anything is created in them, shared by every
//! controller of one virtual node, so a burst of pods or Services in a new namespace asks the
//! lower API server once, not once per object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use tensile_core::deps::lower_namespace;
use tokio::sync::OnceCell;

use crate::clients::already_exists;

/// The lower namespaces known to exist.
pub struct LowerNamespaces {
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
    /// For the lower cluster of `lower`, namespaces created carry the marks of node `owner`.
    pub fn new(lower: kube::Client, owner: String) -> Self {
        LowerNamespaces {
            lower,
            owner,
            known: Mutex::default(),
        }
    }

    /// Creates namespace `name` in the lower cluster unless it is known to exist (an existing
    /// one, ours or not, is used as it is). Concurrent callers for one namespace wait for the
    /// first one's answer.
    pub async fn ensure(&self, name: &str) -> Result<(), kube::Error> {
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
            match Api::<Namespace>::all(self.lower.clone())
                .create(&PostParams::default(), &lower_namespace(name, &self.owner))
                .await
            {
                Err(e) if !already_exists(&e) => Err(e),
                _ => Ok(()),
            }
        })
        .await
        .map(|_| ())
    }

    /// Forgets namespace `name`: a creation in it failed, and it may have been deleted.
    pub fn forget(&self, name: &str) {
        let mut known = match self.known.lock() {
            Ok(known) => known,
            Err(poisoned) => poisoned.into_inner(),
        };
        known.remove(name);
    }
}
