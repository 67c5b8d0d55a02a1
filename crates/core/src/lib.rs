//! The pure rules of tensile-kube: functions of values over k8s-openapi types. No I/O, no
//! async, no Kubernetes client: everything here is decided from the objects the controllers
//! hand in, so every rule is unit tested without a server.
//!
//! - [`keys`]: every label, annotation, taint and well-known name, and our ownership marks.
//! - [`cluster_selector`]: the `clusterSelector` annotation codec, byte-compatible with the
//!   original's JSON.
//! - [`quantity`] and [`resources`]: Kubernetes quantities and pod effective requests.
//! - [`capacity`]: the live capacity model of a lower cluster, fed by node and pod events.
//! - [`fit`]: the fit predicates shared by the scheduler extender, descheduler and capacity.
//! - [`deps`]: which ConfigMaps, Secrets, PVCs and ServiceAccount a pod needs.
//! - [`absent`]: optional references missing upstairs are missing downstairs too.
//! - [`events`]: lower events about our pods mirrored onto the upper pods.
//! - [`translate`]: upper pod -> lower pod, and lower copies of the objects it needs.
//! - [`downward`]: downward API field values of a pod, as a kubelet resolves them.
//! - [`node`]: the virtual Node object, its conditions and taints, flag/env parsing.
//! - [`lease`]: whether another process holds the virtual node's Lease.
//! - [`lower_token`]: when the node renews its own lower token, and the kubeconfig it writes back.
//! - [`certs`]: when a serving certificate kept in a Secret, and its CA, are renewed.
//! - [`reach`]: why a cluster could not be reached, in words, and when to say so in an Event.
//! - [`plan`]: creation order of a pod's lower objects and what to do with existing ones.
//! - [`update`]: which upper pod changes may be applied to the lower pod.
//! - [`status`]: lower pod -> upper pod status.
//! - [`services`]: lower copies of upper Services and Endpoints.
//! - [`node_ports`]: where the virtual node's node ports forward to.
//! - [`guard`]: review caches, accept back-off and rate-limited warnings of the listeners.
//! - [`names`]: Kubernetes name syntax (qualified names, DNS-1123 subdomains).
//! - [`duration`]: durations as the flags take them (Go's syntax).
//! - [`identity`]: upper identity of offloaded pods (tokens, CA, the upper API in env).
//! - [`env_events`]: the virtual-kubelet library's environment events of a pod.
//! - [`sync`]: the pod controller's whole decision for one pod.
//! - [`volumes`]: PersistentVolumes and claims of offloaded pods.
//! - [`bootstrap`]: the virtual node's upper identity by TLS bootstrap.
//! - [`join`]: the objects `tensile join` and `tensile unjoin` apply and remove.
//! - [`extender`]: the scheduler extender's fit and score of virtual nodes.
//! - [`deschedule`]: when the descheduler moves a pod.
//! - [`inject`]: the mutating webhook's rules.
//! - [`summary`]: what `tensile up` and `tensile status` show per node.
#![forbid(unsafe_code)]

pub mod absent;
pub mod bootstrap;
pub mod capacity;
pub mod certs;
pub mod cluster_selector;
pub mod deps;
pub mod deschedule;
pub mod downward;
pub mod duration;
pub mod env_events;
pub mod events;
pub mod extender;
pub mod fit;
pub mod guard;
pub mod identity;
pub mod inject;
pub mod join;
pub mod keys;
pub mod lease;
pub mod lower_token;
pub mod names;
pub mod node;
pub mod node_ports;
pub mod plan;
pub mod quantity;
pub mod reach;
pub mod resources;
pub mod services;
pub mod status;
pub mod summary;
pub mod sync;
pub mod translate;
pub mod update;
pub mod volumes;
