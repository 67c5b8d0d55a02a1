//! The creation of a lower pod, as a state machine that decides and a writer that only
//! answers. [`Creation::next`] takes the answer to the last question and says what to do next
//! ([`Ask`]); the writer (`pods.rs`) carries out that one step, reading or writing, and hands
//! the answer back ([`Answer`]). Every decision is here: the order (`tensile_core::plan`), a
//! ServiceAccount the operator keeps, whether a dependency is ready, pending, not ours, or
//! absent and left out of the pod (`tensile_core::absent`), what an object already holding a
//! name means (`tensile_core::plan::on_existing`), and the lower pod itself.
//!
//! Ephemeral containers added with `kubectl debug` go through the same dependency steps
//! ([`Creation::dependencies`]).

use std::collections::VecDeque;

use k8s_openapi::api::core::v1::{Pod, PodSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tensile_core::absent::{Absent, drop_absent};
use tensile_core::deps::{lower_service_account, pod_dependencies};
use tensile_core::plan::{Existing, LowerKind, Step, creation_plan, on_existing};
use tensile_core::translate::{TranslateConfig, lower_pod};

use crate::copy_index::CopyState;
use crate::sync_error::{Call, Cluster, SyncError};

/// What the writer does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// Send the environment events of the upper pod (what its env names that is missing).
    EnvEvents,
    /// Make sure the pod's namespace exists downstairs.
    EnsureNamespace,
    /// Create our lower object of this kind (answer [`Answer::Done`] or
    /// [`Answer::AlreadyExists`]).
    Create(Object),
    /// Read the metadata of the lower object of this kind and name that holds the name (answer
    /// [`Answer::Existing`]).
    ReadExisting(LowerKind, String),
    /// Read the upper object a dependency names (answer [`Answer::Upper`]).
    ReadUpper(LowerKind, String),
    /// Look up our copy of the upper object of this UID (answer [`Answer::Copy`]).
    CopyState(LowerKind, String, Option<String>),
    /// For an optional reference whose object is missing upstairs: whether the reference
    /// leaves the lower pod, that is whether nothing of ours holds the name downstairs (answer
    /// [`Answer::LeaveOut`]; `tensile_core::absent::optional_missing_is_absent`).
    LeaveOut(LowerKind, String),
    /// Keep the pod's upper tokens current downstairs (with upper identity).
    WriteTokens,
    /// Delete our stale lower pod of an earlier upper pod of the name (UID precondition).
    DeleteStalePod(Option<String>),
    /// The lower pod exists and is ours: the creation is over.
    Created,
    /// The dependencies are settled (only from [`Creation::dependencies`]): what is absent.
    Settled(Absent),
}

/// An object to create downstairs.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A ServiceAccount.
    ServiceAccount(Box<ServiceAccount>),
    /// The pod.
    Pod(Box<Pod>),
}

/// What the writer found or did.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Nothing asked yet.
    Start,
    /// Done as asked.
    Done,
    /// The create was answered AlreadyExists.
    AlreadyExists,
    /// The metadata of the object holding the name.
    Existing(Box<ObjectMeta>),
    /// The upper object: its UID and, for a Secret, whether it may be copied (a
    /// service-account token may not: why); None when the upper cluster does not have it.
    Upper(Option<UpperObject>),
    /// Our copy's state.
    Copy(CopyState),
    /// Whether the optional reference leaves the lower pod.
    LeaveOut(bool),
}

/// What the creation needs to know of an upper dependency.
#[derive(Clone, Debug, PartialEq)]
pub struct UpperObject {
    /// Its UID.
    pub uid: Option<String>,
    /// Why it is never copied (a service-account token Secret), if so.
    pub not_copyable: Option<String>,
}

/// Where the creation is.
#[derive(Clone, Debug, PartialEq)]
enum Phase {
    /// Not started.
    Start,
    /// The environment events are being sent.
    Env,
    /// Between steps of the plan.
    Steps,
    /// The namespace is being made sure of.
    Namespace,
    /// Our ServiceAccount of this name is being created, or the one holding its name read.
    ServiceAccount(String),
    /// Resolving the dependency of this step.
    Dependency(Step),
    /// The tokens are being written.
    Tokens,
    /// The pod is being created, or the one holding its name read.
    Pod,
    /// Our stale pod is being deleted.
    Stale,
    /// Over.
    Done,
}

/// One creation in progress (see the module's documentation).
#[derive(Clone, Debug)]
pub struct Creation {
    namespace: String,
    name: String,
    /// The upper pod; None for the ephemeral containers' dependencies.
    upper: Option<Box<Pod>>,
    translate: TranslateConfig,
    /// The lower cluster's name, for errors.
    lower_name: String,
    /// Create the lower ServiceAccounts pods use (`--enable-serviceaccount`).
    service_accounts: bool,
    steps: VecDeque<Step>,
    absent: Absent,
    phase: Phase,
}

impl Creation {
    /// The creation of the lower pod of upper pod `upper`; an error for a pod without a name.
    pub fn pod(
        upper: &Pod,
        translate: &TranslateConfig,
        lower_name: &str,
        service_accounts: bool,
    ) -> Result<Self, SyncError> {
        let (Some(namespace), Some(name)) = (&upper.metadata.namespace, &upper.metadata.name)
        else {
            return Err(SyncError::Invalid("pod without name".into()));
        };
        let steps = creation_plan(namespace, name, &pod_dependencies(upper));
        Ok(Creation {
            namespace: namespace.clone(),
            name: name.clone(),
            upper: Some(Box::new(upper.clone())),
            translate: translate.clone(),
            lower_name: lower_name.to_owned(),
            service_accounts,
            steps: steps.into(),
            absent: Absent::default(),
            phase: Phase::Start,
        })
    }

    /// The ConfigMaps and Secrets that new ephemeral containers `spec` reference, in
    /// namespace `ns`: settled ([`Ask::Settled`]) once each is copied or absent.
    pub fn dependencies(
        ns: &str,
        spec: &PodSpec,
        translate: &TranslateConfig,
        lower_name: &str,
    ) -> Self {
        let probe = Pod {
            spec: Some(spec.clone()),
            ..Pod::default()
        };
        let steps = creation_plan(ns, "", &pod_dependencies(&probe))
            .into_iter()
            .filter(|s| matches!(s.kind, LowerKind::ConfigMap | LowerKind::Secret))
            .collect();
        Creation {
            namespace: ns.to_owned(),
            name: String::new(),
            upper: None,
            translate: translate.clone(),
            lower_name: lower_name.to_owned(),
            service_accounts: false,
            steps,
            absent: Absent::default(),
            phase: Phase::Steps,
        }
    }

    fn lower(&self) -> Cluster {
        Cluster::Lower(self.lower_name.clone())
    }

    fn ownership(&self, kind: LowerKind, name: &str) -> SyncError {
        SyncError::Ownership {
            kind: kind_name(kind),
            namespace: self.namespace.clone(),
            name: name.to_owned(),
            cluster: self.lower(),
        }
    }

    fn upper_uid(&self) -> &str {
        self.upper
            .as_ref()
            .and_then(|u| u.metadata.uid.as_deref())
            .unwrap_or_default()
    }

    /// What to do after `answer` (to the last [`Ask`]). An error ends the creation.
    pub fn next(&mut self, answer: Answer) -> Result<Ask, SyncError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, answer) {
            (Phase::Start, _) => {
                self.phase = Phase::Env;
                Ok(Ask::EnvEvents)
            }
            (Phase::Env | Phase::Steps | Phase::Namespace, _) => self.next_step(),
            (Phase::ServiceAccount(_), Answer::Done) => self.next_step(),
            (Phase::ServiceAccount(name), Answer::AlreadyExists) => {
                self.phase = Phase::ServiceAccount(name.clone());
                Ok(Ask::ReadExisting(LowerKind::ServiceAccount, name))
            }
            (Phase::ServiceAccount(name), Answer::Existing(meta)) => {
                let owner = &self.translate.owner;
                match on_existing(LowerKind::ServiceAccount, &meta, owner, "") {
                    Existing::Ours | Existing::UseAsIs | Existing::Sibling => self.next_step(),
                    Existing::Stale | Existing::Conflict => {
                        Err(self.ownership(LowerKind::ServiceAccount, &name))
                    }
                }
            }
            (Phase::Dependency(step), answer) => self.dependency(step, answer),
            (Phase::Tokens, _) => {
                let upper = self.upper.as_deref().ok_or_else(no_pod)?;
                let mut pod = lower_pod(upper, &self.translate)
                    .map_err(|e| SyncError::Invalid(Box::new(e)))?;
                if let Some(spec) = pod.spec.as_mut() {
                    drop_absent(spec, &self.absent);
                }
                self.phase = Phase::Pod;
                Ok(Ask::Create(Object::Pod(Box::new(pod))))
            }
            (Phase::Pod, Answer::Done) => Ok(Ask::Created),
            (Phase::Pod, Answer::AlreadyExists) => {
                self.phase = Phase::Pod;
                Ok(Ask::ReadExisting(LowerKind::Pod, self.name.clone()))
            }
            (Phase::Pod, Answer::Existing(meta)) => {
                let owner = self.translate.owner.clone();
                match on_existing(LowerKind::Pod, &meta, &owner, self.upper_uid()) {
                    Existing::Ours => Ok(Ask::Created),
                    // Ours, of an earlier upper pod of the name: it goes, and its deletion
                    // brings the key back (the cache was behind).
                    Existing::Stale => {
                        self.phase = Phase::Stale;
                        Ok(Ask::DeleteStalePod(meta.uid.clone()))
                    }
                    _ => Err(self.ownership(LowerKind::Pod, &self.name.clone())),
                }
            }
            (Phase::Stale, _) => Err(SyncError::Conflict {
                call: Call::new("creating", "Pod", &self.namespace, &self.name, self.lower()),
                source: "the lower pod of an earlier upper pod of the name is being replaced"
                    .into(),
            }),
            (phase, answer) => Err(SyncError::Invalid(
                format!("the creation of a lower pod got {answer:?} in {phase:?}").into(),
            )),
        }
    }

    /// The next step of the plan.
    fn next_step(&mut self) -> Result<Ask, SyncError> {
        let Some(step) = self.steps.pop_front() else {
            self.phase = Phase::Done;
            return Ok(Ask::Settled(std::mem::take(&mut self.absent)));
        };
        match step.kind {
            LowerKind::Namespace => {
                self.phase = Phase::Namespace;
                Ok(Ask::EnsureNamespace)
            }
            // The operator creates lower ServiceAccounts by hand: theirs is the one to use.
            LowerKind::ServiceAccount if !self.service_accounts => self.next_step(),
            LowerKind::ServiceAccount => {
                let account =
                    lower_service_account(&step.name, &self.namespace, &self.translate.owner);
                self.phase = Phase::ServiceAccount(step.name);
                Ok(Ask::Create(Object::ServiceAccount(Box::new(account))))
            }
            LowerKind::ConfigMap | LowerKind::Secret | LowerKind::PersistentVolumeClaim => {
                let ask = Ask::ReadUpper(step.kind, step.name.clone());
                self.phase = Phase::Dependency(step);
                Ok(ask)
            }
            // With upper identity: the pod's token Secret first, ours, then the pod
            // (`PodTokens::write` says why the writes are serial).
            LowerKind::Pod => {
                self.phase = Phase::Tokens;
                Ok(Ask::WriteTokens)
            }
        }
    }

    /// A dependency after `answer`: ready (our copy is there), waiting for its copy, not ours,
    /// or absent (an optional reference the upper cluster does not have, or never lets go:
    /// left out of the lower pod, so a lower object of the name is never read).
    fn dependency(&mut self, step: Step, answer: Answer) -> Result<Ask, SyncError> {
        let (kind, name) = (step.kind, step.name.clone());
        let absent = |this: &mut Self| {
            match kind {
                LowerKind::ConfigMap => this.absent.config_maps.insert(name.clone()),
                _ => this.absent.secrets.insert(name.clone()),
            };
            this.next_step()
        };
        match answer {
            Answer::Upper(Some(UpperObject {
                not_copyable: Some(why),
                ..
            })) => {
                // Service-account tokens belong to the upper cluster: never copied, so missing
                // downstairs by design. Mandatory, retrying changes nothing: the Secret's (or
                // the pod's) next change brings the pod back.
                if step.optional {
                    absent(self)
                } else {
                    Err(SyncError::Invalid(why.into()))
                }
            }
            Answer::Upper(Some(UpperObject { uid, .. })) => {
                self.phase = Phase::Dependency(step);
                Ok(Ask::CopyState(kind, name, uid))
            }
            // As a kubelet waits for a claim (the original skipped it, and the lower pod
            // mounted a lower claim of that name).
            Answer::Upper(None) if step.optional && kind != LowerKind::PersistentVolumeClaim => {
                self.phase = Phase::Dependency(step);
                Ok(Ask::LeaveOut(kind, name))
            }
            Answer::Upper(None) => Err(SyncError::MissingDependency {
                kind: lower_resource(kind),
                namespace: self.namespace.clone(),
                name,
                why: "not found in the upper cluster",
            }),
            Answer::LeaveOut(true) => absent(self),
            // A copy of ours holds the name (its original just went): the reference stays,
            // and the copy controller deletes the copy.
            Answer::LeaveOut(false) => self.next_step(),
            Answer::Copy(CopyState::Ready) => self.next_step(),
            Answer::Copy(CopyState::Pending(failed)) => Err(SyncError::CopyPending {
                kind: kind_name(kind),
                namespace: self.namespace.clone(),
                name,
                cluster: self.lower(),
                failed,
            }),
            Answer::Copy(CopyState::NotOurs) => Err(self.ownership(kind, &name)),
            other => Err(SyncError::Invalid(
                format!("the dependency {kind:?} {name} got {other:?}").into(),
            )),
        }
    }
}

fn no_pod() -> SyncError {
    SyncError::Invalid("a creation without its upper pod".into())
}

/// A kind's name in messages, as `kubectl` spells it.
pub fn kind_name(kind: LowerKind) -> &'static str {
    match kind {
        LowerKind::Namespace => "Namespace",
        LowerKind::ServiceAccount => "ServiceAccount",
        LowerKind::ConfigMap => "ConfigMap",
        LowerKind::Secret => "Secret",
        LowerKind::PersistentVolumeClaim => "PersistentVolumeClaim",
        LowerKind::Pod => "Pod",
    }
}

/// A kind's resource name, as the API spells it.
fn lower_resource(kind: LowerKind) -> &'static str {
    match kind {
        LowerKind::ConfigMap => "configmap",
        LowerKind::Secret => "secret",
        LowerKind::PersistentVolumeClaim => "persistentvolumeclaim",
        LowerKind::Namespace => "namespace",
        LowerKind::ServiceAccount => "serviceaccount",
        LowerKind::Pod => "pod",
    }
}

#[cfg(test)]
mod tests {
    //! A creation driven by hand: each answer a writer could give, and what follows.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;
    use tensile_core::keys::{ANNOTATION_UPPER_UID, LABEL_OWNER, owner_label_value};

    fn translate() -> TranslateConfig {
        TranslateConfig {
            owner: "vk".into(),
            ignore_labels: Vec::new(),
            upper_api: None,
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn start(p: &Pod, service_accounts: bool) -> (Creation, Ask) {
        let mut c = Creation::pod(p, &translate(), "a", service_accounts).unwrap();
        let first = c.next(Answer::Start).unwrap();
        (c, first)
    }

    fn ours(upper_uid: &str) -> Box<ObjectMeta> {
        Box::new(ObjectMeta {
            labels: Some([(LABEL_OWNER.to_owned(), owner_label_value("vk"))].into()),
            annotations: Some([(ANNOTATION_UPPER_UID.to_owned(), upper_uid.to_owned())].into()),
            uid: Some("l-old".into()),
            ..ObjectMeta::default()
        })
    }

    fn upper(uid: &str) -> Answer {
        Answer::Upper(Some(UpperObject {
            uid: Some(uid.into()),
            not_copyable: None,
        }))
    }

    #[test]
    fn a_plain_pod_is_env_events_namespace_tokens_then_the_pod_built_from_the_upper_one() {
        let p = pod(json!({"containers": [{"name": "c", "image": "nginx"}]}));
        let (mut c, first) = start(&p, true);
        assert_eq!(first, Ask::EnvEvents);
        assert_eq!(c.next(Answer::Done).unwrap(), Ask::EnsureNamespace);
        assert_eq!(c.next(Answer::Done).unwrap(), Ask::WriteTokens);
        let Ask::Create(object) = c.next(Answer::Done).unwrap() else {
            panic!("the pod is created next")
        };
        let Object::Pod(lower) = object else {
            panic!("a pod")
        };
        assert_eq!(lower.metadata.name.as_deref(), Some("web"));
        assert_eq!(c.next(Answer::Done).unwrap(), Ask::Created);
    }

    #[test]
    fn a_service_account_is_created_only_when_asked_and_one_not_ours_holds_the_pod() {
        let p = pod(json!({"serviceAccountName": "robot", "containers": [{"name": "c"}]}));
        // Kept by the operator: not created, not read.
        let (mut c, _) = start(&p, false);
        c.next(Answer::Done).unwrap();
        assert_eq!(c.next(Answer::Done).unwrap(), Ask::WriteTokens);
        // Created by us; one of the name that is not ours stops the creation.
        let (mut c, _) = start(&p, true);
        c.next(Answer::Done).unwrap();
        let Ask::Create(object) = c.next(Answer::Done).unwrap() else {
            panic!("the account is created")
        };
        assert!(matches!(object, Object::ServiceAccount(_)));
        assert_eq!(
            c.next(Answer::AlreadyExists).unwrap(),
            Ask::ReadExisting(LowerKind::ServiceAccount, "robot".into())
        );
        let foreign = Box::new(ObjectMeta::default());
        let error = c.next(Answer::Existing(foreign)).unwrap_err();
        assert!(matches!(error, SyncError::Ownership { .. }), "{error}");
    }

    #[test]
    fn dependencies_wait_for_their_copy_and_an_optional_missing_one_leaves_the_pod() {
        let p = pod(json!({
            "containers": [{"name": "c", "envFrom": [
                {"configMapRef": {"name": "cfg"}},
                {"configMapRef": {"name": "maybe", "optional": true}},
            ]}],
        }));
        let (mut c, _) = start(&p, false);
        c.next(Answer::Done).unwrap();
        let mut asks = vec![c.next(Answer::Done).unwrap()];
        // `cfg` is there upstairs: its copy is looked up; pending, the pod waits.
        assert_eq!(asks[0], Ask::ReadUpper(LowerKind::ConfigMap, "cfg".into()));
        let copy = c.next(upper("c1")).unwrap();
        assert_eq!(
            copy,
            Ask::CopyState(LowerKind::ConfigMap, "cfg".into(), Some("c1".into()))
        );
        let mut waiting = c.clone();
        let error = waiting
            .next(Answer::Copy(CopyState::Pending(None)))
            .unwrap_err();
        assert!(matches!(error, SyncError::CopyPending { .. }), "{error}");
        // Ready: the next one, missing upstairs and optional, leaves the pod when nothing of
        // ours holds its name below.
        asks.push(c.next(Answer::Copy(CopyState::Ready)).unwrap());
        assert_eq!(
            asks[1],
            Ask::ReadUpper(LowerKind::ConfigMap, "maybe".into())
        );
        assert_eq!(
            c.next(Answer::Upper(None)).unwrap(),
            Ask::LeaveOut(LowerKind::ConfigMap, "maybe".into())
        );
        assert_eq!(c.next(Answer::LeaveOut(true)).unwrap(), Ask::WriteTokens);
        let Ask::Create(object) = c.next(Answer::Done).unwrap() else {
            panic!("the pod is created")
        };
        let Object::Pod(lower) = object else {
            panic!("a pod")
        };
        let env_from = lower.spec.unwrap().containers[0].env_from.clone().unwrap();
        assert_eq!(env_from.len(), 1, "the absent reference left the pod");
    }

    #[test]
    fn a_mandatory_missing_dependency_or_a_token_secret_stops_the_creation() {
        let p = pod(json!({
            "volumes": [{"name": "s", "secret": {"secretName": "token"}}],
            "containers": [{"name": "c"}],
        }));
        let (mut c, _) = start(&p, false);
        c.next(Answer::Done).unwrap();
        c.next(Answer::Done).unwrap();
        let mut missing = c.clone();
        let error = missing.next(Answer::Upper(None)).unwrap_err();
        assert!(
            matches!(error, SyncError::MissingDependency { .. }),
            "{error}"
        );
        let token = Answer::Upper(Some(UpperObject {
            uid: Some("t".into()),
            not_copyable: Some("a service-account token".into()),
        }));
        let error = c.next(token).unwrap_err();
        assert!(matches!(error, SyncError::Invalid(_)), "{error}");
    }

    #[test]
    fn a_pod_holding_the_name_is_adopted_when_ours_replaced_when_stale_refused_otherwise() {
        let p = pod(json!({"containers": [{"name": "c"}]}));
        let at_pod = || {
            let (mut c, _) = start(&p, false);
            for _ in 0..3 {
                c.next(Answer::Done).unwrap();
            }
            assert_eq!(
                c.next(Answer::AlreadyExists).unwrap(),
                Ask::ReadExisting(LowerKind::Pod, "web".into())
            );
            c
        };
        assert_eq!(
            at_pod().next(Answer::Existing(ours("u1"))).unwrap(),
            Ask::Created
        );
        let mut stale = at_pod();
        assert_eq!(
            stale.next(Answer::Existing(ours("u0"))).unwrap(),
            Ask::DeleteStalePod(Some("l-old".into()))
        );
        let error = stale.next(Answer::Done).unwrap_err();
        assert!(matches!(error, SyncError::Conflict { .. }), "{error}");
        let foreign = Box::new(ObjectMeta::default());
        let error = at_pod().next(Answer::Existing(foreign)).unwrap_err();
        assert!(matches!(error, SyncError::Ownership { .. }), "{error}");
    }

    #[test]
    fn the_dependencies_of_ephemeral_containers_settle_with_what_is_absent() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [],
            "ephemeralContainers": [{"name": "debug", "envFrom": [
                {"secretRef": {"name": "gone", "optional": true}},
            ]}],
        }))
        .unwrap();
        let mut c = Creation::dependencies("ns", &spec, &translate(), "a");
        assert_eq!(
            c.next(Answer::Start).unwrap(),
            Ask::ReadUpper(LowerKind::Secret, "gone".into())
        );
        c.next(Answer::Upper(None)).unwrap();
        let Ask::Settled(absent) = c.next(Answer::LeaveOut(true)).unwrap() else {
            panic!("settled")
        };
        assert!(absent.secrets.contains("gone"));
    }
}
