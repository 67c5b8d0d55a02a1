//! `--tls-secret NAMESPACE/NAME`: the webhook's or the extender's CA and serving certificate
//! kept in a Secret of the upper cluster, so that every replica, and every restart, serves the
//! same certificate from the same CA (a `caBundle` or `tlsConfig.caData` set once stays valid).
//!
//! The Secret (type `kubernetes.io/tls`, label `tensile-kube.io/owner=<component>`) holds
//! `tls.crt`/`tls.key` (the serving certificate), `ca.crt` (the CAs clients are to trust: one,
//! or two while a CA is replaced) and `ca.key` (their keys, in the same order). At start it is
//! read; a missing one is generated and created, and when two replicas create it at once the
//! loser reads the winner's. Every write carries the resourceVersion read (a conflict means
//! read again and decide again, never overwrite), and a Secret without our label is never
//! written. When to renew is `tensile_core::certs`; each replica watches the Secret (one watch,
//! by name), swaps the certificate it presents when the Secret changes ([`LiveCert`]), and
//! sleeps until the next renewal falls due. A deleted Secret is written back from memory, so
//! the CA survives that too.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData as _,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tensile_core::certs::{self, Leaf, Observed, Plan, Policy, Signer, Validity};
use tensile_core::keys::LABEL_OWNER;
use tensile_runtime::api_error::{ApiClass, classify};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::serve::{LiveCert, ServeError, ServingCert};

/// The Secret's type: kubectl, cert-manager users and `kubectl create secret tls` know it.
pub const SECRET_TYPE_TLS: &str = "kubernetes.io/tls";
/// The serving certificate (PEM).
pub const KEY_TLS_CRT: &str = "tls.crt";
/// The serving certificate's key (PEM, PKCS#8).
pub const KEY_TLS_KEY: &str = "tls.key";
/// The CAs clients trust (PEM, one or two certificates).
pub const KEY_CA_CRT: &str = "ca.crt";
/// The keys of the CAs of [`KEY_CA_CRT`], in the same order (PEM, PKCS#8).
pub const KEY_CA_KEY: &str = "ca.key";

/// How many times a write meets another writer's change before giving up (for now: the watch
/// or the timer tries again).
const TRIES: usize = 5;
/// The longest sleep between two decisions: the wall clock may jump while a timer sleeps.
const MAX_SLEEP: Duration = Duration::from_secs(3600);
/// Retry delays after a failed read or write: 5 s doubling to 5 minutes.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// `NAMESPACE/NAME` of the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl FromStr for SecretName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
        }
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What to keep in the Secret.
#[derive(Clone, Debug)]
pub struct TlsSecretConfig {
    /// The Secret.
    pub secret: SecretName,
    /// The component: the value of our owner label and the certificates' common name.
    pub owner: String,
    /// Names and addresses the serving certificate must be valid for; names a certificate in
    /// the Secret already has are kept, so replicas with different lists do not take turns.
    pub names: Vec<String>,
    /// Lifetimes.
    pub policy: Policy,
}

/// The Secret could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsSecretError {
    /// It exists and is not ours: never written.
    #[error(
        "Secret {secret} is not ours ({why}); refusing to overwrite it: delete it or name another Secret with --tls-secret"
    )]
    Foreign {
        /// The Secret.
        secret: SecretName,
        /// What its marks say.
        why: String,
    },
    /// It is ours but its CA cannot be read.
    #[error(
        "Secret {secret} cannot be used: {what} (delete it to have a new CA and certificate generated)"
    )]
    Unreadable {
        /// The Secret.
        secret: SecretName,
        /// What is wrong.
        what: String,
    },
    /// The API server refused or failed.
    #[error("Secret {secret}: {source}")]
    Api {
        /// The Secret.
        secret: SecretName,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Every try met another writer's change.
    #[error("Secret {secret}: it kept changing under {tries} tries to write it")]
    Conflicts {
        /// The Secret.
        secret: SecretName,
        /// How many.
        tries: usize,
    },
    /// A certificate could not be issued.
    #[error("Secret {secret}: issuing a certificate: {what}")]
    Issue {
        /// The Secret.
        secret: SecretName,
        /// Why.
        what: String,
    },
    /// The certificate cannot be served.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Where a replica stands, for logs and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSecretState {
    /// The resourceVersion of the Secret the certificate served comes from.
    pub resource_version: String,
    /// When the next renewal falls due (the replica wakes then).
    pub next: Option<Timestamp>,
    /// How many times this replica wrote the Secret.
    pub writes: u64,
}

/// A running `--tls-secret`: the certificate to present, the CA bundle to publish, kept current.
#[derive(Debug, Clone)]
pub struct TlsSecret {
    /// The certificate presented, replaced when the Secret changes.
    pub cert: LiveCert,
    /// The CAs clients are to trust (`ca.crt`), changing when a CA joins or leaves.
    pub bundle: watch::Receiver<String>,
    /// Where this replica stands.
    pub state: watch::Receiver<TlsSecretState>,
}

/// Reads the Secret (creating or renewing it when needed), then keeps watching it until `stop`.
pub async fn start(
    client: kube::Client,
    config: TlsSecretConfig,
    stop: CancellationToken,
) -> Result<TlsSecret, TlsSecretError> {
    let api: Api<Secret> = Api::namespaced(client, &config.secret.namespace);
    let mut keeper = Keeper {
        api,
        config,
        memory: None,
        writes: 0,
    };
    // An upper cluster that does not answer at start is waited for, as a watch waits: exiting
    // made a crash loop of every restart that met the outage. A refusal is final.
    let mut pause = Duration::from_millis(250);
    let kept = loop {
        match keeper.converge(Seed::Fetch).await {
            Err(TlsSecretError::Api { secret, source })
                if classify(&source) == ApiClass::Transient && !stop.is_cancelled() =>
            {
                tracing::warn!(%secret, error = %source, "the upper cluster does not answer: reading the Secret again in {pause:?}");
                tokio::select! {
                    () = stop.cancelled() => return Err(TlsSecretError::Api { secret, source }),
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(4));
            }
            other => break other?,
        }
    };
    let cert = LiveCert::new(kept.material.serving())?;
    let (bundle_tx, bundle) = watch::channel(kept.material.bundle());
    let (state_tx, state) = watch::channel(TlsSecretState {
        resource_version: kept.resource_version.clone(),
        next: Some(kept.next),
        writes: keeper.writes,
    });
    tracing::info!(secret = %keeper.config.secret, next_renewal = %kept.next, "serving the certificate of the Secret");
    keeper.memory = Some(kept.material);
    tokio::spawn(keeper.run(
        cert.clone(),
        bundle_tx,
        state_tx,
        kept.next,
        kept.resource_version,
        stop,
    ));
    Ok(TlsSecret {
        cert,
        bundle,
        state,
    })
}

/// A CA of the bundle.
#[derive(Clone, PartialEq, Eq)]
struct Ca {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
    validity: Validity,
}

/// The serving certificate.
#[derive(Clone, PartialEq, Eq)]
struct LeafCert {
    cert_pem: String,
    key_pem: String,
    validity: Validity,
    issuer: Option<usize>,
    names: BTreeSet<String>,
}

/// What the Secret holds, read.
#[derive(Clone, PartialEq, Eq)]
struct Material {
    cas: Vec<Ca>,
    leaf: Option<LeafCert>,
}

impl Material {
    fn bundle(&self) -> String {
        self.cas.iter().map(|c| c.cert_pem.as_str()).collect()
    }

    /// What to present: a serving certificate exists whenever the plan was carried out.
    fn serving(&self) -> ServingCert {
        let (cert_pem, key_pem) = self
            .leaf
            .as_ref()
            .map(|l| (l.cert_pem.clone(), l.key_pem.clone()))
            .unwrap_or_default();
        ServingCert {
            cert_pem,
            key_pem,
            ca_pem: self.bundle(),
        }
    }

    fn leaf_pem(&self) -> Option<&str> {
        self.leaf.as_ref().map(|l| l.cert_pem.as_str())
    }
}

/// Where [`Keeper::converge`] starts.
enum Seed {
    /// Read the Secret first.
    Fetch,
    /// This is the Secret as last seen (None: it does not exist).
    Seen(Option<Box<Secret>>),
}

/// The material written or read, its resourceVersion, and when to look again.
struct Kept {
    material: Material,
    resource_version: String,
    next: Timestamp,
}

struct Keeper {
    api: Api<Secret>,
    config: TlsSecretConfig,
    /// The last material served: what a deleted Secret is written back from.
    memory: Option<Material>,
    writes: u64,
}

fn pem_blocks(text: &str, label: &str) -> Vec<String> {
    let (begin, end) = (
        format!("-----BEGIN {label}-----"),
        format!("-----END {label}-----"),
    );
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(&begin) {
        let Some(stop) = rest[at..].find(&end) else {
            break;
        };
        let stop = at + stop + end.len();
        out.push(format!("{}\n", &rest[at..stop]));
        rest = &rest[stop..];
    }
    out
}

/// A name as a certificate holds it: an IP address in its canonical form, a DNS name in lower
/// case.
fn normal_name(name: &str) -> String {
    name.parse::<IpAddr>()
        .map_or_else(|_| name.to_ascii_lowercase(), |ip| ip.to_string())
}

fn validity_of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<Validity> {
    let v = cert.validity();
    Some(Validity {
        not_before: Timestamp::from_second(v.not_before.timestamp()).ok()?,
        not_after: Timestamp::from_second(v.not_after.timestamp()).ok()?,
    })
}

fn key_matches(cert: &x509_parser::certificate::X509Certificate<'_>, key: &KeyPair) -> bool {
    cert.public_key().subject_public_key.data.as_ref() == key.der_bytes()
}

fn data_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// rcgen takes `time`'s dates: the epoch plus seconds (certificates before 1970 are not issued).
fn set_validity(params: &mut CertificateParams, validity: &Validity) {
    let since_epoch = |t: Timestamp| Duration::from_secs(u64::try_from(t.as_second()).unwrap_or(0));
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since_epoch(validity.not_before);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + since_epoch(validity.not_after);
}

impl Keeper {
    fn secret(&self) -> SecretName {
        self.config.secret.clone()
    }

    fn api_error(&self, source: kube::Error) -> TlsSecretError {
        TlsSecretError::Api {
            secret: self.secret(),
            source,
        }
    }

    fn issue_error(&self, what: impl fmt::Display) -> TlsSecretError {
        TlsSecretError::Issue {
            secret: self.secret(),
            what: what.to_string(),
        }
    }

    /// Ours: the owner label names this component.
    fn check_ours(&self, secret: &Secret) -> Result<(), TlsSecretError> {
        let owner = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER));
        let why = match owner {
            Some(o) if *o == self.config.owner => return Ok(()),
            Some(o) => format!(
                "its label {LABEL_OWNER} is {o:?}, not {:?}",
                self.config.owner
            ),
            None => format!("it has no label {LABEL_OWNER}"),
        };
        Err(TlsSecretError::Foreign {
            secret: self.secret(),
            why,
        })
    }

    /// Reads our Secret: the CAs must be readable (else it is an error: replacing them would
    /// break every client), the serving certificate may be missing or broken (it is renewed).
    fn read(&self, secret: &Secret) -> Result<Material, TlsSecretError> {
        let unreadable = |what: String| TlsSecretError::Unreadable {
            secret: self.secret(),
            what,
        };
        let ca_pems = pem_blocks(
            &data_text(secret, KEY_CA_CRT).unwrap_or_default(),
            "CERTIFICATE",
        );
        let key_pems = pem_blocks(
            &data_text(secret, KEY_CA_KEY).unwrap_or_default(),
            "PRIVATE KEY",
        );
        if ca_pems.is_empty() || ca_pems.len() != key_pems.len() {
            return Err(unreadable(format!(
                "{KEY_CA_CRT} holds {} certificates and {KEY_CA_KEY} {} keys",
                ca_pems.len(),
                key_pems.len()
            )));
        }
        let mut cas = Vec::new();
        for (i, (cert_pem, key_pem)) in ca_pems.into_iter().zip(key_pems).enumerate() {
            let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
                .map_err(|e| unreadable(format!("CA {} of {KEY_CA_CRT}: {e}", i + 1)))?;
            let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref())
                .map_err(|e| unreadable(format!("CA {} of {KEY_CA_CRT}: {e}", i + 1)))?;
            let key = KeyPair::from_pem(&key_pem)
                .map_err(|e| unreadable(format!("key {} of {KEY_CA_KEY}: {e}", i + 1)))?;
            if !key_matches(&parsed, &key) {
                return Err(unreadable(format!(
                    "key {} of {KEY_CA_KEY} is not the key of CA {} of {KEY_CA_CRT}",
                    i + 1,
                    i + 1
                )));
            }
            let validity = validity_of(&parsed)
                .ok_or_else(|| unreadable(format!("CA {} of {KEY_CA_CRT}: validity", i + 1)))?;
            cas.push(Ca {
                cert_pem,
                key_pem,
                der: der.as_ref().to_vec(),
                validity,
            });
        }
        let leaf = self.read_leaf(secret, &cas);
        Ok(Material { cas, leaf })
    }

    fn read_leaf(&self, secret: &Secret, cas: &[Ca]) -> Option<LeafCert> {
        let cert_pem = pem_blocks(&data_text(secret, KEY_TLS_CRT)?, "CERTIFICATE")
            .into_iter()
            .next()?;
        let key_pem = data_text(secret, KEY_TLS_KEY)?;
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
        let key = KeyPair::from_pem(&key_pem).ok()?;
        if !key_matches(&parsed, &key) {
            return None;
        }
        let issuer = cas.iter().position(|ca| {
            x509_parser::parse_x509_certificate(&ca.der)
                .is_ok_and(|(_, c)| parsed.verify_signature(Some(c.public_key())).is_ok())
        });
        let mut names = BTreeSet::new();
        if let Ok(Some(san)) = parsed.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        names.insert(normal_name(d));
                    }
                    x509_parser::extensions::GeneralName::IPAddress(b) => {
                        let ip = match b.len() {
                            4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                            16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                            _ => None,
                        };
                        names.extend(ip.map(|ip| ip.to_string()));
                    }
                    _ => {}
                }
            }
        }
        Some(LeafCert {
            validity: validity_of(&parsed)?,
            cert_pem,
            key_pem,
            issuer,
            names,
        })
    }

    fn plan(&self, material: &Material, now: Timestamp) -> Plan {
        let cas: Vec<Validity> = material.cas.iter().map(|c| c.validity).collect();
        let wanted: BTreeSet<String> = self.config.names.iter().map(|n| normal_name(n)).collect();
        let leaf = material.leaf.as_ref().map(|l| Leaf {
            validity: l.validity,
            issuer: l.issuer,
            has_names: wanted.is_subset(&l.names),
        });
        certs::plan(&Observed { cas: &cas, leaf }, now, &self.config.policy)
    }

    fn new_ca(&self, now: Timestamp) -> Result<Ca, TlsSecretError> {
        let validity = certs::ca_validity(now, &self.config.policy);
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| self.issue_error(e))?;
        let mut dn = DistinguishedName::new();
        // The time in the name tells the CAs of a bundle apart (as k3s names its own).
        dn.push(
            DnType::CommonName,
            format!("{}-ca@{}", self.config.owner, now.as_second()),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params, &validity);
        let key = KeyPair::generate().map_err(|e| self.issue_error(e))?;
        let cert = params.self_signed(&key).map_err(|e| self.issue_error(e))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().as_ref().to_vec(),
            validity,
        })
    }

    fn new_leaf(
        &self,
        ca: &Ca,
        issuer: usize,
        names: BTreeSet<String>,
        now: Timestamp,
    ) -> Result<LeafCert, TlsSecretError> {
        let validity = certs::leaf_validity(now, &self.config.policy, &ca.validity);
        let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| self.issue_error(e))?;
        let signer = Issuer::from_ca_cert_der(&CertificateDer::from(ca.der.as_slice()), ca_key)
            .map_err(|e| self.issue_error(e))?;
        let mut params =
            crate::serve::serving_params(&self.config.owner, names.iter().cloned().collect())
                .map_err(|e| self.issue_error(e))?;
        set_validity(&mut params, &validity);
        let key = KeyPair::generate().map_err(|e| self.issue_error(e))?;
        let cert = params
            .signed_by(&key, &signer)
            .map_err(|e| self.issue_error(e))?;
        Ok(LeafCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            validity,
            issuer: Some(issuer),
            names,
        })
    }

    /// The material after `plan`.
    fn apply(
        &self,
        material: &Material,
        plan: &Plan,
        now: Timestamp,
    ) -> Result<Material, TlsSecretError> {
        let kept: Vec<usize> = (0..material.cas.len())
            .filter(|i| !plan.drop_cas.contains(i))
            .collect();
        let mut cas: Vec<Ca> = kept.iter().map(|&i| material.cas[i].clone()).collect();
        let mut signer = match plan.signer {
            Signer::Existing(i) => kept.iter().position(|&k| k == i),
            Signer::New => None,
        };
        if plan.add_ca || signer.is_none() {
            cas.push(self.new_ca(now)?);
            if signer.is_none() {
                signer = Some(cas.len() - 1);
            }
        }
        let signer = signer.unwrap_or(0);
        let leaf = match (&plan.renew, &material.leaf) {
            (None, Some(leaf)) => Some(LeafCert {
                issuer: leaf.issuer.and_then(|i| kept.iter().position(|&k| k == i)),
                ..leaf.clone()
            }),
            (_, old) => {
                let mut names: BTreeSet<String> =
                    self.config.names.iter().map(|n| normal_name(n)).collect();
                if let Some(old) = old {
                    names.extend(old.names.iter().cloned());
                }
                let ca = cas
                    .get(signer)
                    .ok_or_else(|| self.issue_error("no CA to sign with"))?;
                Some(self.new_leaf(ca, signer, names, now)?)
            }
        };
        Ok(Material { cas, leaf })
    }

    /// The Secret for `material`, built on `base` (the Secret read: its resourceVersion is the
    /// write's precondition; its other labels, annotations and keys are kept).
    fn secret_of(&self, material: &Material, base: Option<&Secret>) -> Secret {
        let mut secret = base.cloned().unwrap_or_else(|| Secret {
            metadata: ObjectMeta {
                name: Some(self.config.secret.name.clone()),
                namespace: Some(self.config.secret.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        });
        secret
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_OWNER.to_owned(), self.config.owner.clone());
        secret.type_ = Some(SECRET_TYPE_TLS.to_owned());
        let data = secret.data.get_or_insert_with(Default::default);
        let (cert, key) = material
            .leaf
            .as_ref()
            .map(|l| (l.cert_pem.clone(), l.key_pem.clone()))
            .unwrap_or_default();
        let ca_keys: String = material.cas.iter().map(|c| c.key_pem.as_str()).collect();
        for (k, v) in [
            (KEY_TLS_CRT, cert),
            (KEY_TLS_KEY, key),
            (KEY_CA_CRT, material.bundle()),
            (KEY_CA_KEY, ca_keys),
        ] {
            data.insert(k.to_owned(), ByteString(v.into_bytes()));
        }
        secret
    }

    fn log_write(&self, before: Option<&Material>, after: &Material, plan: Option<&Plan>) {
        let before_cas: Vec<&[u8]> = before
            .map(|m| m.cas.iter().map(|c| c.der.as_slice()).collect())
            .unwrap_or_default();
        let added = after
            .cas
            .iter()
            .filter(|c| !before_cas.contains(&c.der.as_slice()))
            .count();
        if before.is_some() && added > 0 {
            let signs_until = before
                .and_then(|m| m.cas.iter().map(|c| c.validity).min_by_key(|v| v.not_after))
                .map(|v| certs::signing_ends(&v).to_string())
                .unwrap_or_default();
            tracing::warn!(
                secret = %self.config.secret,
                old_ca_signs_until = %signs_until,
                "a new CA joined the bundle ca.crt: clients that were given the CA by hand \
                 (kube-scheduler's tlsConfig.caData) must take the new bundle before the old CA \
                 stops signing"
            );
        }
        match (before, plan.and_then(|p| p.renew)) {
            (None, _) => tracing::info!(
                secret = %self.config.secret,
                from_memory = self.memory.is_some(),
                "created the Secret: CA and serving certificate"
            ),
            (Some(_), Some(why)) => tracing::info!(
                secret = %self.config.secret,
                reason = %why,
                cas = after.cas.len(),
                "renewed the serving certificate"
            ),
            (Some(_), None) => tracing::info!(
                secret = %self.config.secret,
                cas = after.cas.len(),
                "changed the CA bundle"
            ),
        }
    }

    /// Brings the Secret to what the plan wants, starting from `seed`, and returns what it
    /// holds then. A conflict or a vanished Secret reads it again and decides again; what was
    /// written is read back and planned again, so what is returned has nothing due.
    async fn converge(&mut self, seed: Seed) -> Result<Kept, TlsSecretError> {
        let mut seen = match seed {
            Seed::Fetch => None,
            Seed::Seen(s) => Some(s.map(|b| *b)),
        };
        for _ in 0..TRIES {
            let current = match seen.take() {
                Some(s) => s,
                None => self
                    .api
                    .get_opt(&self.config.secret.name)
                    .await
                    .map_err(|e| self.api_error(e))?,
            };
            let now = Timestamp::now();
            let Some(current) = current else {
                // Absent: written back from memory, or generated.
                let material = match &self.memory {
                    Some(m) => m.clone(),
                    None => {
                        let empty = Material {
                            cas: Vec::new(),
                            leaf: None,
                        };
                        let plan = self.plan(&empty, now);
                        self.apply(&empty, &plan, now)?
                    }
                };
                let secret = self.secret_of(&material, None);
                match self.api.create(&PostParams::default(), &secret).await {
                    Ok(created) => {
                        self.writes += 1;
                        self.log_write(None, &material, None);
                        seen = Some(Some(created));
                        continue;
                    }
                    // Another replica created it first: read theirs.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(self.api_error(e)),
                }
            };
            self.check_ours(&current)?;
            let material = self.read(&current)?;
            let plan = self.plan(&material, now);
            if !plan.writes() {
                return Ok(Kept {
                    material,
                    resource_version: current
                        .metadata
                        .resource_version
                        .clone()
                        .unwrap_or_default(),
                    next: plan.next,
                });
            }
            let renewed = self.apply(&material, &plan, now)?;
            let secret = self.secret_of(&renewed, Some(&current));
            match self
                .api
                .replace(&self.config.secret.name, &PostParams::default(), &secret)
                .await
            {
                Ok(written) => {
                    self.writes += 1;
                    self.log_write(Some(&material), &renewed, Some(&plan));
                    seen = Some(Some(written));
                }
                // Changed (another replica renewed it first) or deleted since read: read again.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                Err(e) => return Err(self.api_error(e)),
            }
        }
        Err(TlsSecretError::Conflicts {
            secret: self.secret(),
            tries: TRIES,
        })
    }

    /// Watches the Secret and wakes when the next renewal falls due, until `stop`.
    async fn run(
        mut self,
        cert: LiveCert,
        bundle: watch::Sender<String>,
        state: watch::Sender<TlsSecretState>,
        mut next: Timestamp,
        mut resource_version: String,
        stop: CancellationToken,
    ) {
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.config.secret.name));
        let mut events = std::pin::pin!(tensile_runtime::backoff::watch(self.api.clone(), config));
        let mut last: Option<Secret> = None;
        let mut seen_in_init = false;
        let mut retry = RETRY_FIRST;
        let mut failed_until: Option<tokio::time::Instant> = None;
        loop {
            let wake = failed_until.unwrap_or_else(|| {
                let delay = Duration::try_from(next.duration_since(Timestamp::now()))
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_SLEEP);
                tokio::time::Instant::now() + delay
            });
            let seed = tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {
                    // Due (or retrying): decide from the Secret as last seen; a write that finds
                    // it changed reads it again.
                    match &last {
                        Some(s) => Seed::Seen(Some(Box::new(s.clone()))),
                        None => Seed::Fetch,
                    }
                }
                event = events.next() => match event {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(secret = %self.config.secret, error = %e, "watch error");
                        continue;
                    }
                    Some(Ok(watcher::Event::Init)) => {
                        seen_in_init = false;
                        continue;
                    }
                    Some(Ok(watcher::Event::InitApply(s))) => {
                        seen_in_init = true;
                        last = Some(s.clone());
                        if s.metadata.resource_version.as_deref() == Some(resource_version.as_str()) {
                            continue;
                        }
                        Seed::Seen(Some(Box::new(s)))
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        if seen_in_init {
                            continue;
                        }
                        last = None;
                        Seed::Seen(None)
                    }
                    Some(Ok(watcher::Event::Apply(s))) => {
                        last = Some(s.clone());
                        if s.metadata.resource_version.as_deref() == Some(resource_version.as_str()) {
                            continue;
                        }
                        Seed::Seen(Some(Box::new(s)))
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        last = None;
                        tracing::warn!(secret = %self.config.secret, "the Secret was deleted: writing it back");
                        Seed::Seen(None)
                    }
                }
            };
            match self.converge(seed).await {
                Ok(kept) => {
                    failed_until = None;
                    retry = RETRY_FIRST;
                    let changed = self.memory.as_ref().map(Material::leaf_pem)
                        != Some(kept.material.leaf_pem());
                    if changed {
                        match cert.replace(kept.material.serving()) {
                            Ok(()) => {
                                tracing::info!(secret = %self.config.secret, next_renewal = %kept.next, "serving the renewed certificate")
                            }
                            Err(e) => {
                                tracing::error!(secret = %self.config.secret, error = %e, "cannot serve the certificate of the Secret; keeping the current one")
                            }
                        }
                    }
                    let new_bundle = kept.material.bundle();
                    bundle.send_if_modified(|b| {
                        if *b == new_bundle {
                            return false;
                        }
                        *b = new_bundle;
                        true
                    });
                    next = kept.next;
                    resource_version = kept.resource_version.clone();
                    self.memory = Some(kept.material);
                    state.send_replace(TlsSecretState {
                        resource_version: kept.resource_version,
                        next: Some(next),
                        writes: self.writes,
                    });
                }
                Err(e) => {
                    tracing::error!(secret = %self.config.secret, error = %e, retry_in = ?retry, "keeping the current serving certificate");
                    failed_until = Some(tokio::time::Instant::now() + retry);
                    retry = (retry * 2).min(RETRY_MAX);
                    state.send_modify(|s| s.writes = self.writes);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_namespace_slash_name() {
        assert_eq!(
            "kube-system/tensile-webhook-tls".parse::<SecretName>(),
            Ok(SecretName {
                namespace: "kube-system".into(),
                name: "tensile-webhook-tls".into()
            })
        );
        for bad in ["tls", "/tls", "ns/", "a/b/c"] {
            assert!(bad.parse::<SecretName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn pem_blocks_are_cut_out_of_a_bundle() {
        let text = "junk\n-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n\
                    -----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n";
        assert_eq!(
            pem_blocks(text, "CERTIFICATE"),
            [
                "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n",
                "-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n"
            ]
        );
        assert!(pem_blocks(text, "PRIVATE KEY").is_empty());
    }

    #[test]
    fn names_compare_in_their_canonical_form() {
        assert_eq!(normal_name("Tensile.Example"), "tensile.example");
        assert_eq!(normal_name("::0001"), "::1");
        assert_eq!(normal_name("127.0.0.1"), "127.0.0.1");
    }
}
