//! The `caBundle` of the webhook's MutatingWebhookConfiguration, kept to the CAs its serving
//! certificate's Secret holds (`tensile webhook --webhook-configuration`, and the sandbox, which
//! registers the shipped configuration).

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;

/// The caBundle could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    /// The API server refused or did not answer.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// Every write met another writer's change.
    #[error("kept conflicting: {0}")]
    Conflicts(String),
}

/// Puts `ca_pem` into every webhook of the configuration, unless every one holds it already
/// (so that replicas sharing a CA do not rewrite it in turn): whether it wrote. The write
/// carries the resourceVersion read; a conflict reads again.
pub async fn write_ca_bundle(
    client: &kube::Client,
    name: &str,
    ca_pem: &str,
) -> Result<bool, CaBundleError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = k8s_openapi::ByteString(ca_pem.as_bytes().to_vec());
    let mut last = None;
    for _ in 0..3 {
        let mut config = api.get(name).await?;
        let hooks = config.webhooks.iter_mut().flatten();
        let mut changed = false;
        for hook in hooks {
            if hook.client_config.ca_bundle.as_ref() != Some(&bundle) {
                hook.client_config.ca_bundle = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(s),
            Err(e) => return Err(e.into()),
        }
    }
    Err(CaBundleError::Conflicts(format!("{last:?}")))
}

/// Writes each new CA bundle (a CA joined or left the Secret) into the configuration,
/// retrying with back-off until it is written, until `stop`.
pub async fn keep_ca_bundle(
    client: kube::Client,
    name: String,
    mut bundle: tokio::sync::watch::Receiver<String>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            changed = bundle.changed() => if changed.is_err() { return },
        }
        let mut delay = Duration::from_secs(1);
        loop {
            let pem = bundle.borrow_and_update().clone();
            match write_ca_bundle(&client, &name, &pem).await {
                Ok(written) => {
                    if written {
                        tracing::info!(configuration = %name, "the CA bundle changed: caBundle written");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(configuration = %name, error = %e, retry_in = ?delay, "writing the caBundle");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(60));
                }
            }
        }
    }
}
