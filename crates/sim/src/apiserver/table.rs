//! Server-side printing: the `Table` representation `kubectl get` asks for
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), with the columns the real server
//! prints for each resource, so `kubectl get pods -o wide` shows READY, STATUS, IP and NODE.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::meta;
use super::resources::ResourceType;

/// Whether the request asks for a Table.
pub fn wants_table(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|t| {
            let t = t.replace(' ', "");
            t.contains("as=Table")
                && t.contains("g=meta.k8s.io")
                && (t.contains("v=v1;") || t.ends_with("v=v1"))
        })
    })
}

#[derive(Debug)]
struct Column {
    name: &'static str,
    kind: &'static str,
    /// `name` for a column holding an object's name, else empty.
    format: &'static str,
    priority: u8,
}

const fn col(name: &'static str, kind: &'static str, priority: u8) -> Column {
    Column {
        name,
        kind,
        format: "",
        priority,
    }
}

/// A column of object names (`format: name`).
const fn name_col(name: &'static str) -> Column {
    Column {
        name,
        kind: "string",
        format: "name",
        priority: 0,
    }
}

/// How a kind prints as a Table (the real server's printer of the kind): its columns and the
/// cells of one object, named by the kind's row in `resources::RESOURCES`.
#[derive(Debug)]
pub(crate) struct Printer {
    columns: &'static [Column],
    /// Pushes the cells of `obj` (its age and now given) onto the row.
    cells: fn(&Value, String, Timestamp, &mut Vec<Value>),
    /// Whether a Name column comes first (every kind but events).
    name_first: bool,
}

/// A printer whose first column is the name.
const fn named(
    columns: &'static [Column],
    cells: fn(&Value, String, Timestamp, &mut Vec<Value>),
) -> Printer {
    Printer {
        columns,
        cells,
        name_first: true,
    }
}

impl Printer {
    fn columns(&self) -> Vec<&Column> {
        let name = self.name_first.then_some(&NAME);
        name.into_iter().chain(self.columns).collect()
    }

    fn cells(&self, obj: &Value, now: Timestamp) -> Vec<Value> {
        let age = meta::meta_str(obj, "creationTimestamp")
            .and_then(meta::parse_time)
            .map(|t| human_duration(now, t))
            .unwrap_or_else(|| "<unknown>".into());
        let mut c = Vec::new();
        if self.name_first {
            c.push(json!(meta::name(obj).unwrap_or_default()));
        }
        (self.cells)(obj, age, now, &mut c);
        c
    }
}

const NAME: Column = name_col("Name");

fn arr(obj: &Value, p: &str) -> Vec<Value> {
    obj.pointer(p)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn count(obj: &Value, p: &str) -> usize {
    obj.pointer(p)
        .and_then(Value::as_object)
        .map_or(0, serde_json::Map::len)
}

fn int(obj: &Value, p: &str) -> i64 {
    obj.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

pub(crate) static PODS: Printer = named(
    &[
        col("Ready", "string", 0),
        col("Status", "string", 0),
        col("Restarts", "string", 0),
        col("Age", "string", 0),
        col("IP", "string", 1),
        col("Node", "string", 1),
        col("Nominated Node", "string", 1),
        col("Readiness Gates", "string", 1),
    ],
    |obj, age, now, c| {
        let statuses = arr(obj, "/status/containerStatuses");
        let total = arr(obj, "/spec/containers").len();
        let ready = statuses
            .iter()
            .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
            .count();
        // Restarts of every container, with when the latest ended (`1 (5s ago)`).
        let all = statuses
            .iter()
            .chain(arr(obj, "/status/initContainerStatuses").iter())
            .cloned()
            .collect::<Vec<_>>();
        let restarts: i64 = all
            .iter()
            .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
            .sum();
        let last_restart = all
            .iter()
            .filter_map(|s| s.pointer("/lastState/terminated/finishedAt"))
            .filter_map(Value::as_str)
            .filter_map(meta::parse_time)
            .max();
        let restarts = match last_restart {
            Some(at) if restarts != 0 => {
                format!("{restarts} ({} ago)", human_duration(now, at))
            }
            _ => restarts.to_string(),
        };
        c.extend([
            json!(format!("{ready}/{total}")),
            json!(pod_status(obj)),
            json!(restarts),
            json!(age),
            json!(or_none(s(obj.pointer("/status/podIP")))),
            json!(or_none(s(obj.pointer("/spec/nodeName")))),
            json!(or_none(s(obj.pointer("/status/nominatedNodeName")))),
            json!("<none>"),
        ]);
    },
);

pub(crate) static NODES: Printer = named(
    &[
        col("Status", "string", 0),
        col("Roles", "string", 0),
        col("Age", "string", 0),
        col("Version", "string", 0),
        col("Internal-IP", "string", 1),
        col("External-IP", "string", 1),
        col("OS-Image", "string", 1),
        col("Kernel-Version", "string", 1),
        col("Container-Runtime", "string", 1),
    ],
    |obj, age, _now, c| {
        let ready = arr(obj, "/status/conditions")
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
            .map(|c| s(c.get("status")));
        let mut status = match ready.as_deref() {
            Some("True") => "Ready".to_owned(),
            _ => "NotReady".to_owned(),
        };
        if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
            status.push_str(",SchedulingDisabled");
        }
        let roles: Vec<String> = meta::labels(obj)
            .into_iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("node-role.kubernetes.io/")
                    .map(str::to_owned)
                    .or_else(|| (k == "kubernetes.io/role").then_some(v))
            })
            .collect();
        let addr = |t: &str| {
            arr(obj, "/status/addresses")
                .iter()
                .find(|a| a.get("type").and_then(Value::as_str) == Some(t))
                .map(|a| s(a.get("address")))
                .unwrap_or_default()
        };
        c.extend([
            json!(status),
            json!(or_none(roles.join(","))),
            json!(age),
            json!(s(obj.pointer("/status/nodeInfo/kubeletVersion"))),
            json!(or_none(addr("InternalIP"))),
            json!(or_none(addr("ExternalIP"))),
            json!(or_none(s(obj.pointer("/status/nodeInfo/osImage")))),
            json!(or_none(s(obj.pointer("/status/nodeInfo/kernelVersion")))),
            json!(or_none(s(
                obj.pointer("/status/nodeInfo/containerRuntimeVersion")
            ))),
        ]);
    },
);

pub(crate) static NAMESPACES: Printer = named(
    &[col("Status", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([json!(s(obj.pointer("/status/phase"))), json!(age)]);
    },
);

pub(crate) static SERVICES: Printer = named(
    &[
        col("Type", "string", 0),
        col("Cluster-IP", "string", 0),
        col("External-IP", "string", 0),
        col("Port(s)", "string", 0),
        col("Age", "string", 0),
        col("Selector", "string", 1),
    ],
    |obj, age, _now, c| {
        let ports: Vec<String> = arr(obj, "/spec/ports")
            .iter()
            .map(|p| {
                let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                let proto = s(p.get("protocol"));
                match p.get("nodePort").and_then(Value::as_i64) {
                    Some(n) => format!("{port}:{n}/{proto}"),
                    None => format!("{port}/{proto}"),
                }
            })
            .collect();
        let selector: Vec<String> = meta::string_map(obj.pointer("/spec/selector"))
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let external = match s(obj.pointer("/spec/type")).as_str() {
            "LoadBalancer" => "<pending>".to_owned(),
            _ => "<none>".to_owned(),
        };
        c.extend([
            json!(s(obj.pointer("/spec/type"))),
            json!(s(obj.pointer("/spec/clusterIP"))),
            json!(external),
            json!(or_none(ports.join(","))),
            json!(age),
            json!(or_none(selector.join(","))),
        ]);
    },
);

pub(crate) static CONFIG_MAPS: Printer = named(
    &[col("Data", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([
            json!(count(obj, "/data") + count(obj, "/binaryData")),
            json!(age),
        ]);
    },
);

pub(crate) static SECRETS: Printer = named(
    &[
        col("Type", "string", 0),
        col("Data", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(s(obj.pointer("/type"))),
            json!(count(obj, "/data")),
            json!(age),
        ]);
    },
);

pub(crate) static ENDPOINTS: Printer = named(
    &[col("Endpoints", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        let eps: Vec<String> = arr(obj, "/subsets")
            .iter()
            .flat_map(|sub| {
                let ports: Vec<i64> = sub
                    .get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("port").and_then(Value::as_i64))
                    .collect();
                sub.get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .flat_map(move |a| {
                        let ip = s(a.get("ip"));
                        ports.clone().into_iter().map(move |p| format!("{ip}:{p}"))
                    })
            })
            .collect();
        c.extend([json!(or_none(eps.join(","))), json!(age)]);
    },
);

pub(crate) static PERSISTENT_VOLUME_CLAIMS: Printer = named(
    &[
        col("Status", "string", 0),
        col("Volume", "string", 0),
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("StorageClass", "string", 0),
        col("VolumeAttributesClass", "string", 0),
        col("Age", "string", 0),
        col("VolumeMode", "string", 1),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(s(obj.pointer("/status/phase"))),
            json!(s(obj.pointer("/spec/volumeName"))),
            json!(s(obj.pointer("/status/capacity/storage"))),
            json!(access_modes(obj)),
            json!(s(obj.pointer("/spec/storageClassName"))),
            json!(or_unset(s(obj.pointer("/spec/volumeAttributesClassName")))),
            json!(age),
            json!(s(obj.pointer("/spec/volumeMode"))),
        ]);
    },
);

pub(crate) static DEPLOYMENTS: Printer = named(
    &[
        col("Ready", "string", 0),
        col("Up-to-date", "string", 0),
        col("Available", "string", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    |obj, age, _now, c| {
        let containers = arr(obj, "/spec/template/spec/containers");
        let names: Vec<String> = containers.iter().map(|c| s(c.get("name"))).collect();
        let images: Vec<String> = containers.iter().map(|c| s(c.get("image"))).collect();
        let selector: Vec<String> = meta::string_map(obj.pointer("/spec/selector/matchLabels"))
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        c.extend([
            json!(format!(
                "{}/{}",
                int(obj, "/status/readyReplicas"),
                int(obj, "/spec/replicas")
            )),
            json!(int(obj, "/status/updatedReplicas")),
            json!(int(obj, "/status/availableReplicas")),
            json!(age),
            json!(names.join(",")),
            json!(images.join(",")),
            json!(selector.join(",")),
        ]);
    },
);

pub(crate) static REPLICA_SETS: Printer = named(
    &[
        col("Desired", "integer", 0),
        col("Current", "integer", 0),
        col("Ready", "integer", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(int(obj, "/spec/replicas")),
            json!(int(obj, "/status/replicas")),
            json!(int(obj, "/status/readyReplicas")),
            json!(age),
        ]);
        c.extend(template_cells(obj, true));
    },
);

pub(crate) static LEASES: Printer = named(
    &[col("Holder", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| c.extend([json!(s(obj.pointer("/spec/holderIdentity"))), json!(age)]),
);

pub(crate) static ROLES: Printer = named(&[col("Created At", "date", 0)], |obj, _age, _now, c| {
    c.push(json!(s(obj.pointer("/metadata/creationTimestamp"))));
});

pub(crate) static ROLE_BINDINGS: Printer = named(
    &[
        col("Role", "string", 0),
        col("Age", "string", 0),
        col("Users", "string", 1),
        col("Groups", "string", 1),
        col("ServiceAccounts", "string", 1),
    ],
    |obj, age, _now, c| {
        let subjects = arr(obj, "/subjects");
        let of_kind = |kind: &str| {
            let names: Vec<String> = subjects
                .iter()
                .filter(|x| x.get("kind").and_then(Value::as_str) == Some(kind))
                .map(|x| {
                    let name = s(x.get("name"));
                    if kind == "ServiceAccount" {
                        format!("{}/{name}", s(x.get("namespace")))
                    } else {
                        name
                    }
                })
                .collect();
            names.join(", ")
        };
        c.extend([
            json!(format!(
                "{}/{}",
                s(obj.pointer("/roleRef/kind")),
                s(obj.pointer("/roleRef/name"))
            )),
            json!(age),
            json!(of_kind("User")),
            json!(of_kind("Group")),
            json!(of_kind("ServiceAccount")),
        ]);
    },
);

pub(crate) static LIMIT_RANGES: Printer =
    named(&[col("Created At", "date", 0)], |obj, _age, _now, c| {
        c.push(json!(s(obj.pointer("/metadata/creationTimestamp"))));
    });

pub(crate) static PERSISTENT_VOLUMES: Printer = named(
    &[
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("Reclaim Policy", "string", 0),
        col("Status", "string", 0),
        col("Claim", "string", 0),
        col("StorageClass", "string", 0),
        col("VolumeAttributesClass", "string", 0),
        col("Reason", "string", 0),
        col("Age", "string", 0),
        col("VolumeMode", "string", 1),
    ],
    |obj, age, _now, c| {
        let claim = match (
            s(obj.pointer("/spec/claimRef/namespace")),
            s(obj.pointer("/spec/claimRef/name")),
        ) {
            (_, name) if name.is_empty() => String::new(),
            (ns, name) => format!("{ns}/{name}"),
        };
        let status = if meta::deleting(obj) {
            "Terminating".to_owned()
        } else {
            s(obj.pointer("/status/phase"))
        };
        c.extend([
            json!(s(obj.pointer("/spec/capacity/storage"))),
            json!(access_modes(obj)),
            json!(s(obj.pointer("/spec/persistentVolumeReclaimPolicy"))),
            json!(status),
            json!(claim),
            json!(s(obj.pointer("/spec/storageClassName"))),
            json!(or_unset(s(obj.pointer("/spec/volumeAttributesClassName")))),
            json!(s(obj.pointer("/status/reason"))),
            json!(age),
            json!(s(obj.pointer("/spec/volumeMode"))),
        ]);
    },
);

pub(crate) static RESOURCE_QUOTAS: Printer = named(
    &[
        col("Request", "string", 0),
        col("Limit", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let hard = obj.pointer("/spec/hard").and_then(Value::as_object);
        let (mut requests, mut limits) = (Vec::new(), Vec::new());
        let mut names: Vec<&String> = hard.into_iter().flat_map(|h| h.keys()).collect();
        names.sort();
        for name in names {
            let used = obj
                .pointer(&format!(
                    "/status/used/{}",
                    name.replace('~', "~0").replace('/', "~1")
                ))
                .and_then(Value::as_str)
                .unwrap_or("0");
            let limit = s(hard.and_then(|h| h.get(name)));
            let text = format!("{name}: {used}/{limit}");
            if name.split('.').next() == Some("limits") && name.contains('.') {
                limits.push(text);
            } else {
                requests.push(text);
            }
        }
        c.extend([
            json!(requests.join(", ")),
            json!(limits.join(", ")),
            json!(age),
        ]);
    },
);

pub(crate) static SERVICE_ACCOUNTS: Printer = named(
    &[col("Secrets", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([json!(arr(obj, "/secrets").len()), json!(age)]);
    },
);

pub(crate) static WEBHOOK_CONFIGURATIONS: Printer = named(
    &[col("Webhooks", "integer", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([json!(arr(obj, "/webhooks").len()), json!(age)]);
    },
);

pub(crate) static DAEMON_SETS: Printer = named(
    &[
        col("Desired", "integer", 0),
        col("Current", "integer", 0),
        col("Ready", "integer", 0),
        col("Up-to-date", "integer", 0),
        col("Available", "integer", 0),
        col("Node Selector", "string", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(int(obj, "/status/desiredNumberScheduled")),
            json!(int(obj, "/status/currentNumberScheduled")),
            json!(int(obj, "/status/numberReady")),
            json!(int(obj, "/status/updatedNumberScheduled")),
            json!(int(obj, "/status/numberAvailable")),
            json!(or_none(pairs(
                obj.pointer("/spec/template/spec/nodeSelector")
            ))),
            json!(age),
        ]);
        c.extend(template_cells(obj, true));
    },
);

pub(crate) static STATEFUL_SETS: Printer = named(
    &[
        col("Ready", "string", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(format!(
                "{}/{}",
                int(obj, "/status/readyReplicas"),
                int(obj, "/spec/replicas")
            )),
            json!(age),
        ]);
        c.extend(template_cells(obj, false));
    },
);

pub(crate) static CONTROLLER_REVISIONS: Printer = named(
    &[
        col("Controller", "string", 0),
        col("Revision", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        // `group-kind/name` of its controller, lowercased (`statefulset.apps/web`).
        let controller = obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
            .map_or_else(
                || "<none>".to_owned(),
                |r| {
                    let api = s(r.get("apiVersion"));
                    let group = api.rsplit_once('/').map(|(g, _)| g).unwrap_or_default();
                    let kind = s(r.get("kind"));
                    let gk = if group.is_empty() {
                        kind
                    } else {
                        format!("{kind}.{group}")
                    };
                    format!("{}/{}", gk.to_lowercase(), s(r.get("name")))
                },
            );
        c.extend([json!(controller), json!(int(obj, "/revision")), json!(age)]);
    },
);

pub(crate) static CRON_JOBS: Printer = named(
    &[
        col("Schedule", "string", 0),
        col("Timezone", "string", 0),
        col("Suspend", "boolean", 0),
        col("Active", "integer", 0),
        col("Last Schedule", "string", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    |obj, age, now, c| {
        let last = obj
            .pointer("/status/lastScheduleTime")
            .and_then(Value::as_str)
            .and_then(meta::parse_time)
            .map_or_else(|| "<none>".to_owned(), |t| human_duration(now, t));
        c.extend([
            json!(s(obj.pointer("/spec/schedule"))),
            json!(or_none(s(obj.pointer("/spec/timeZone")))),
            json!(obj.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true)),
            json!(arr(obj, "/status/active").len()),
            json!(last),
            json!(age),
        ]);
        let job = obj
            .pointer("/spec/jobTemplate")
            .cloned()
            .unwrap_or_else(|| json!({}));
        c.extend(template_cells(&job, true));
    },
);

pub(crate) static JOBS: Printer = named(
    &[
        col("Status", "string", 0),
        col("Completions", "string", 0),
        col("Duration", "string", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    |obj, age, now, c| {
        c.extend([
            json!(job_status(obj)),
            json!(job_completions(obj)),
            json!(job_duration(obj, now)),
            json!(age),
        ]);
        c.extend(template_cells(obj, true));
    },
);

pub(crate) static ENDPOINT_SLICES: Printer = named(
    &[
        col("AddressType", "string", 0),
        col("Ports", "string", 0),
        col("Endpoints", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let ports: Vec<String> = arr(obj, "/ports")
            .iter()
            .map(|p| match p.get("port").and_then(Value::as_i64) {
                Some(n) => n.to_string(),
                None => p
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("*")
                    .to_owned(),
            })
            .collect();
        let addresses: Vec<String> = arr(obj, "/endpoints")
            .iter()
            .flat_map(|e| {
                e.get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|a| s(Some(&a)))
            .collect();
        c.extend([
            json!(s(obj.pointer("/addressType"))),
            json!(three_and_more(&ports)),
            json!(three_and_more(&addresses)),
            json!(age),
        ]);
    },
);

pub(crate) static POD_DISRUPTION_BUDGETS: Printer = named(
    &[
        col("Min Available", "string", 0),
        col("Max Unavailable", "string", 0),
        col("Allowed Disruptions", "integer", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let or_na = |p: &str| match obj.pointer(p) {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(t)) => t.clone(),
            _ => "N/A".to_owned(),
        };
        c.extend([
            json!(or_na("/spec/minAvailable")),
            json!(or_na("/spec/maxUnavailable")),
            json!(int(obj, "/status/disruptionsAllowed")),
            json!(age),
        ]);
    },
);

pub(crate) static PRIORITY_CLASSES: Printer = named(
    &[
        col("Value", "integer", 0),
        col("Global-Default", "boolean", 0),
        col("Age", "string", 0),
        col("PreemptionPolicy", "string", 0),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(int(obj, "/value")),
            json!(
                obj.pointer("/globalDefault")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            ),
            json!(age),
            json!(
                obj.pointer("/preemptionPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("PreemptLowerPriority")
            ),
        ]);
    },
);

pub(crate) static STORAGE_CLASSES: Printer = named(
    &[
        col("Provisioner", "string", 0),
        col("ReclaimPolicy", "string", 0),
        col("VolumeBindingMode", "string", 0),
        col("AllowVolumeExpansion", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let default = meta::string_map(obj.pointer("/metadata/annotations"))
            .get("storageclass.kubernetes.io/is-default-class")
            .is_some_and(|v| v == "true");
        if default {
            c[0] = json!(format!("{} (default)", meta::name(obj).unwrap_or_default()));
        }
        c.extend([
            json!(s(obj.pointer("/provisioner"))),
            json!(
                obj.pointer("/reclaimPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("Delete")
            ),
            json!(
                obj.pointer("/volumeBindingMode")
                    .and_then(Value::as_str)
                    .unwrap_or("Immediate")
            ),
            json!(
                obj.pointer("/allowVolumeExpansion")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    .to_string()
            ),
            json!(age),
        ]);
    },
);

pub(crate) static INGRESSES: Printer = named(
    &[
        col("Class", "string", 0),
        col("Hosts", "string", 0),
        col("Address", "string", 0),
        col("Ports", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let class = or_none(s(obj.pointer("/spec/ingressClassName")));
        let hosts: Vec<String> = arr(obj, "/spec/rules")
            .iter()
            .map(|r| s(r.get("host")))
            .filter(|h| !h.is_empty())
            .collect();
        let hosts = if hosts.is_empty() {
            "*".to_owned()
        } else {
            let more = arr(obj, "/spec/rules").len().saturating_sub(3);
            let shown = hosts.iter().take(3).cloned().collect::<Vec<_>>().join(",");
            if hosts.len() > 3 {
                format!("{shown} + {more} more...")
            } else {
                shown
            }
        };
        let mut addresses: Vec<String> = arr(obj, "/status/loadBalancer/ingress")
            .iter()
            .map(|i| {
                let ip = s(i.get("ip"));
                if ip.is_empty() {
                    s(i.get("hostname"))
                } else {
                    ip
                }
            })
            .filter(|a| !a.is_empty())
            .collect();
        addresses.sort();
        addresses.dedup();
        let ports = if arr(obj, "/spec/tls").is_empty() {
            "80"
        } else {
            "80, 443"
        };
        c.extend([
            json!(class),
            json!(hosts),
            json!(addresses.join(",")),
            json!(ports),
            json!(age),
        ]);
    },
);

pub(crate) static INGRESS_CLASSES: Printer = named(
    &[
        col("Controller", "string", 0),
        col("Parameters", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let parameters = match obj.pointer("/spec/parameters") {
            Some(p) => {
                let group = s(p.get("apiGroup"));
                let kind = s(p.get("kind"));
                let kind = if group.is_empty() {
                    kind
                } else {
                    format!("{kind}.{group}")
                };
                format!("{kind}/{}", s(p.get("name")))
            }
            None => "<none>".to_owned(),
        };
        c.extend([
            json!(s(obj.pointer("/spec/controller"))),
            json!(parameters),
            json!(age),
        ]);
    },
);

pub(crate) static NETWORK_POLICIES: Printer = named(
    &[col("Pod-Selector", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([
            json!(label_selector(obj.pointer("/spec/podSelector"))),
            json!(age),
        ]);
    },
);

pub(crate) static HORIZONTAL_POD_AUTOSCALERS: Printer = named(
    &[
        col("Reference", "string", 0),
        col("Targets", "string", 0),
        col("MinPods", "string", 0),
        col("MaxPods", "string", 0),
        col("Replicas", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let min = obj
            .pointer("/spec/minReplicas")
            .and_then(Value::as_i64)
            .map_or_else(|| "<unset>".to_owned(), |n| n.to_string());
        c.extend([
            json!(format!(
                "{}/{}",
                s(obj.pointer("/spec/scaleTargetRef/kind")),
                s(obj.pointer("/spec/scaleTargetRef/name"))
            )),
            json!(hpa_targets(obj)),
            json!(min),
            json!(int(obj, "/spec/maxReplicas")),
            json!(int(obj, "/status/currentReplicas")),
            json!(age),
        ]);
    },
);

pub(crate) static REPLICATION_CONTROLLERS: Printer = named(
    &[
        col("Desired", "integer", 0),
        col("Current", "integer", 0),
        col("Ready", "integer", 0),
        col("Age", "string", 0),
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(
                obj.pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1)
            ),
            json!(int(obj, "/status/replicas")),
            json!(int(obj, "/status/readyReplicas")),
            json!(age),
        ]);
        c.extend(template_cells(obj, false));
        c.push(json!(or_none(pairs(obj.pointer("/spec/selector")))));
    },
);

pub(crate) static POD_TEMPLATES: Printer = named(
    &[
        col("Containers", "string", 0),
        col("Images", "string", 0),
        col("Pod Labels", "string", 0),
    ],
    |obj, _age, _now, c| {
        let template = json!({"spec": obj.get("template").cloned().unwrap_or_default()});
        c.extend(template_cells(&template, false));
        c.push(json!(or_none(pairs(
            obj.pointer("/template/metadata/labels")
        ))));
    },
);

pub(crate) static CSI_DRIVERS: Printer = named(
    &[
        col("AttachRequired", "boolean", 0),
        col("PodInfoOnMount", "boolean", 0),
        col("StorageCapacity", "boolean", 0),
        col("TokenRequests", "string", 0),
        col("RequiresRepublish", "boolean", 0),
        col("Modes", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let flag =
            |p: &str, default: bool| obj.pointer(p).and_then(Value::as_bool).unwrap_or(default);
        let audiences: Option<Vec<String>> = obj
            .pointer("/spec/tokenRequests")
            .and_then(Value::as_array)
            .map(|t| t.iter().map(|r| s(r.get("audience"))).collect());
        let modes: Vec<String> = arr(obj, "/spec/volumeLifecycleModes")
            .iter()
            .map(|m| s(Some(m)))
            .collect();
        c.extend([
            json!(flag("/spec/attachRequired", true)),
            json!(flag("/spec/podInfoOnMount", false)),
            json!(flag("/spec/storageCapacity", false)),
            json!(audiences.map_or_else(|| "<unset>".to_owned(), |a| a.join(","))),
            json!(flag("/spec/requiresRepublish", false)),
            json!(or_none(modes.join(","))),
            json!(age),
        ]);
    },
);

pub(crate) static CSI_NODES: Printer = named(
    &[col("Drivers", "integer", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([json!(arr(obj, "/spec/drivers").len()), json!(age)]);
    },
);

pub(crate) static CSI_STORAGE_CAPACITIES: Printer =
    named(&[col("Created At", "date", 0)], |obj, _age, _now, c| {
        c.push(json!(s(obj.pointer("/metadata/creationTimestamp"))));
    });

pub(crate) static VOLUME_ATTACHMENTS: Printer = named(
    &[
        name_col("Attacher"),
        col("PV", "string", 0),
        col("Node", "string", 0),
        col("Attached", "boolean", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        c.extend([
            json!(s(obj.pointer("/spec/attacher"))),
            json!(s(obj.pointer("/spec/source/persistentVolumeName"))),
            json!(s(obj.pointer("/spec/nodeName"))),
            json!(
                obj.pointer("/status/attached")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            ),
            json!(age),
        ]);
    },
);

pub(crate) static RUNTIME_CLASSES: Printer = named(
    &[col("Handler", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| {
        c.extend([json!(s(obj.pointer("/handler"))), json!(age)]);
    },
);

/// API Priority and Fairness: which priority level a flow schema sends to (`MISSINGPL` is
/// its Dangling condition, `?` before the APF controller, which the simulator has not, sets it).
pub(crate) static FLOW_SCHEMAS: Printer = named(
    &[
        col("PriorityLevel", "string", 0),
        col("MatchingPrecedence", "string", 0),
        col("DistinguisherMethod", "string", 0),
        col("Age", "string", 0),
        col("MissingPL", "string", 0),
    ],
    |obj, age, _now, c| {
        let dangling = arr(obj, "/status/conditions")
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Dangling"))
            .map_or_else(|| "?".to_owned(), |c| s(c.get("status")));
        c.extend([
            json!(s(obj.pointer("/spec/priorityLevelConfiguration/name"))),
            json!(int(obj, "/spec/matchingPrecedence")),
            json!(or_none(s(obj.pointer("/spec/distinguisherMethod/type")))),
            json!(age),
            json!(dangling),
        ]);
    },
);

/// Priority levels: shares and queueing of a Limited one, `<none>` where not set.
pub(crate) static PRIORITY_LEVEL_CONFIGURATIONS: Printer = named(
    &[
        col("Type", "string", 0),
        col("NominalConcurrencyShares", "string", 0),
        col("Queues", "string", 0),
        col("HandSize", "string", 0),
        col("QueueLengthLimit", "string", 0),
        col("Age", "string", 0),
    ],
    |obj, age, _now, c| {
        let limited = obj.pointer("/spec/limited").filter(|l| l.is_object());
        let number = |p: &str| {
            limited
                .and_then(|l| l.pointer(p))
                .filter(|v| v.is_number())
                .cloned()
                .unwrap_or_else(|| json!("<none>"))
        };
        c.extend([
            json!(s(obj.pointer("/spec/type"))),
            number("/nominalConcurrencyShares"),
            number("/limitResponse/queuing/queues"),
            number("/limitResponse/queuing/handSize"),
            number("/limitResponse/queuing/queueLengthLimit"),
            json!(age),
        ]);
    },
);

/// Volume attributes classes: the CSI driver.
pub(crate) static VOLUME_ATTRIBUTES_CLASSES: Printer = named(
    &[col("DriverName", "string", 0), col("Age", "string", 0)],
    |obj, age, _now, c| c.extend([json!(s(obj.pointer("/driverName"))), json!(age)]),
);

/// Kinds without columns of their own: the name and the age.
pub(crate) static DEFAULT: Printer = named(&[col("Age", "string", 0)], |_obj, age, _now, c| {
    c.push(json!(age));
});

/// The columns of both Event kinds (`kubectl get events`): the name comes last.
const EVENT_COLUMNS: &[Column] = &[
    col("Last Seen", "string", 0),
    col("Type", "string", 0),
    col("Reason", "string", 0),
    col("Object", "string", 0),
    col("Subobject", "string", 1),
    col("Source", "string", 1),
    col("Message", "string", 0),
    col("First Seen", "string", 1),
    col("Count", "string", 1),
    Column {
        priority: 1,
        ..name_col("Name")
    },
];

/// Core (`v1`) Events.
pub(crate) static EVENTS: Printer = Printer {
    columns: EVENT_COLUMNS,
    cells: |obj, _age, now, c| c.extend(event_cells("", obj, now)),
    name_first: false,
};

/// `events.k8s.io` Events.
pub(crate) static EVENTS_V1: Printer = Printer {
    columns: EVENT_COLUMNS,
    cells: |obj, _age, now, c| c.extend(event_cells("events.k8s.io", obj, now)),
    name_first: false,
};

fn s(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn or_none(v: String) -> String {
    if v.is_empty() { "<none>".to_owned() } else { v }
}

/// The TARGETS column of an autoscaler (the printers' `formatHPAMetrics`): each metric as
/// `current/target`, `<unknown>` until the status has one, the first two then ` + N more...`.
fn hpa_targets(obj: &Value) -> String {
    let specs = obj
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if specs.is_empty() {
        return "<none>".to_owned();
    }
    let statuses = obj
        .pointer("/status/currentMetrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let quantity = |v: Option<&Value>| match v {
        Some(Value::String(q)) => q.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    let list: Vec<String> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let kind = s(spec.get("type"));
            // The spec and status fields are named after the type, in camelCase.
            let field = match kind.as_str() {
                "Resource" => "resource",
                "ContainerResource" => "containerResource",
                "Pods" => "pods",
                "Object" => "object",
                "External" => "external",
                _ => return "<unknown type>".to_owned(),
            };
            let source = spec.get(field);
            let target = source.and_then(|m| m.get("target"));
            let current = statuses
                .get(i)
                .and_then(|st| st.get(field))
                .and_then(|m| m.get("current"));
            let current_of = |key: &str| {
                let q = quantity(current.and_then(|c| c.get(key)));
                if q.is_empty() {
                    "<unknown>".to_owned()
                } else {
                    q
                }
            };
            let average = target.and_then(|t| t.get("averageValue"));
            match field {
                "resource" | "containerResource" => {
                    let name = s(source.and_then(|m| m.get("name")));
                    if average.is_some() {
                        format!(
                            "{name}: {}/{}",
                            current_of("averageValue"),
                            quantity(average)
                        )
                    } else {
                        let current = current
                            .and_then(|c| c.get("averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or_else(|| "<unknown>".to_owned(), |n| format!("{n}%"));
                        let goal = target
                            .and_then(|t| t.get("averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or_else(|| "<auto>".to_owned(), |n| format!("{n}%"));
                        format!("{name}: {current}/{goal}")
                    }
                }
                "pods" => format!("{}/{}", current_of("averageValue"), quantity(average)),
                _ if average.is_some() => {
                    format!("{}/{} (avg)", current_of("averageValue"), quantity(average))
                }
                _ => format!(
                    "{}/{}",
                    current_of("value"),
                    quantity(target.and_then(|t| t.get("value")))
                ),
            }
        })
        .collect();
    let shown = list.iter().take(2).cloned().collect::<Vec<_>>().join(", ");
    if list.len() > 2 {
        format!("{shown} + {} more...", list.len() - 2)
    } else {
        shown
    }
}

/// `<unset>` for an empty value, as the volume printers show a missing attributes class.
fn or_unset(v: String) -> String {
    if v.is_empty() {
        "<unset>".to_owned()
    } else {
        v
    }
}

/// `k=v,k2=v2` of a string map.
fn pairs(map: Option<&Value>) -> String {
    meta::string_map(map)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The first three, then ` + N more...` (the printers' `listWithMoreString`); `<unset>` when
/// there are none.
fn three_and_more(items: &[String]) -> String {
    if items.is_empty() {
        return "<unset>".to_owned();
    }
    let mut text = items.iter().take(3).cloned().collect::<Vec<_>>().join(",");
    if items.len() > 3 {
        text.push_str(&format!(" + {} more...", items.len() - 3));
    }
    text
}

/// `RWO,ROX,RWX,RWOP` of `spec.accessModes`.
fn access_modes(obj: &Value) -> String {
    obj.pointer("/spec/accessModes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| match m.as_str().unwrap_or_default() {
            "ReadWriteOnce" => "RWO".to_owned(),
            "ReadOnlyMany" => "ROX".to_owned(),
            "ReadWriteMany" => "RWX".to_owned(),
            "ReadWriteOncePod" => "RWOP".to_owned(),
            other => other.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The wide columns of a workload: containers, images and (with `selector`) its selector.
fn template_cells(obj: &Value, selector: bool) -> Vec<Value> {
    let containers = obj
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = containers.iter().map(|c| s(c.get("name"))).collect();
    let images: Vec<String> = containers.iter().map(|c| s(c.get("image"))).collect();
    let mut cells = vec![json!(names.join(",")), json!(images.join(","))];
    if selector {
        cells.push(json!(label_selector(obj.pointer("/spec/selector"))));
    }
    cells
}

/// `metav1.FormatLabelSelector`: `a=b,c in (d,e)`, `<none>` for an empty selector.
fn label_selector(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return "<none>".to_owned();
    };
    let mut parts: Vec<String> = meta::string_map(selector.get("matchLabels"))
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = s(e.get("key"));
        let values: Vec<String> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|v| s(Some(v)))
            .collect();
        parts.push(match s(e.get("operator")).as_str() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key,
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        });
    }
    if parts.is_empty() {
        "<none>".to_owned()
    } else {
        parts.join(",")
    }
}

fn has_condition(obj: &Value, kind: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| s(c.get("type")) == kind && s(c.get("status")) == "True")
}

/// A Job's STATUS column.
fn job_status(job: &Value) -> &'static str {
    if has_condition(job, "Complete") {
        "Complete"
    } else if has_condition(job, "Failed") {
        "Failed"
    } else if meta::deleting(job) {
        "Terminating"
    } else if has_condition(job, "Suspended") {
        "Suspended"
    } else if has_condition(job, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(job, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
}

/// A Job's COMPLETIONS column: `succeeded/completions`, or `n/1 of P` for a work queue.
fn job_completions(job: &Value) -> String {
    let succeeded = job
        .pointer("/status/succeeded")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    match job.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(n) => format!("{succeeded}/{n}"),
        None => match job.pointer("/spec/parallelism").and_then(Value::as_i64) {
            Some(p) if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    }
}

/// A Job's DURATION column: from its start to its completion, or to now while it runs.
fn job_duration(job: &Value, now: Timestamp) -> String {
    let time = |p: &str| {
        job.pointer(p)
            .and_then(Value::as_str)
            .and_then(meta::parse_time)
    };
    match (time("/status/startTime"), time("/status/completionTime")) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration(now, start),
        (Some(start), Some(end)) => human_duration(end, start),
    }
}

/// The cells of an Event, core or `events.k8s.io` (whose fields have other names).
fn event_cells(group: &str, obj: &Value, now: Timestamp) -> Vec<Value> {
    let core = group.is_empty();
    let field =
        |core_path: &str, new_path: &str| obj.pointer(if core { core_path } else { new_path });
    let time = |v: Option<&Value>| v.and_then(Value::as_str).and_then(meta::parse_time);
    let event_time = time(obj.pointer("/eventTime"));
    let series_last = time(obj.pointer("/series/lastObservedTime"));
    let last = series_last
        .or_else(|| time(field("/lastTimestamp", "/deprecatedLastTimestamp")))
        .or(event_time)
        .or_else(|| time(obj.pointer("/metadata/creationTimestamp")));
    let first = time(field("/firstTimestamp", "/deprecatedFirstTimestamp")).or(event_time);
    let ago =
        |t: Option<Timestamp>| t.map_or_else(|| "<unknown>".into(), |t| human_duration(now, t));
    let involved = if core {
        "/involvedObject"
    } else {
        "/regarding"
    };
    let object = format!(
        "{}/{}",
        s(obj.pointer(&format!("{involved}/kind"))).to_lowercase(),
        s(obj.pointer(&format!("{involved}/name")))
    );
    let component = s(field("/source/component", "/deprecatedSource/component"));
    let component = if component.is_empty() {
        s(field("/reportingComponent", "/reportingController"))
    } else {
        component
    };
    let host = s(field("/source/host", "/deprecatedSource/host"));
    let host = if host.is_empty() {
        s(obj.pointer("/reportingInstance"))
    } else {
        host
    };
    let source = if host.is_empty() {
        component
    } else {
        format!("{component}, {host}")
    };
    let count = obj
        .pointer("/series/count")
        .or_else(|| field("/count", "/deprecatedCount"))
        .and_then(Value::as_i64)
        .filter(|c| *c != 0)
        .unwrap_or(1);
    vec![
        json!(ago(last)),
        json!(s(obj.pointer("/type"))),
        json!(s(obj.pointer("/reason"))),
        json!(object),
        json!(s(obj.pointer(&format!("{involved}/fieldPath")))),
        json!(source),
        json!(s(field("/message", "/note"))),
        json!(ago(first)),
        json!(count),
        json!(meta::name(obj).unwrap_or_default()),
    ]
}

/// kubectl's pod STATUS column.
fn pod_status(pod: &Value) -> String {
    if meta::deleting(pod) {
        return "Terminating".into();
    }
    let mut reason = s(pod.pointer("/status/reason"));
    if reason.is_empty() {
        reason = s(pod.pointer("/status/phase"));
    }
    let inits = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total_init = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    for (i, c) in inits.iter().enumerate() {
        if let Some(t) = c.pointer("/state/terminated")
            && t.get("exitCode").and_then(Value::as_i64) == Some(0)
        {
            continue;
        }
        if let Some(w) = c
            .pointer("/state/waiting/reason")
            .and_then(Value::as_str)
            .filter(|r| *r != "PodInitializing")
        {
            return format!("Init:{w}");
        }
        return format!("Init:{i}/{total_init}");
    }
    for c in pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(w) = c.pointer("/state/waiting/reason").and_then(Value::as_str) {
            reason = w.to_owned();
        } else if let Some(t) = c.pointer("/state/terminated") {
            reason = t
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    format!(
                        "ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    )
                });
        }
    }
    reason
}

/// `duration.HumanDuration` of apimachinery.
pub fn human_duration(now: Timestamp, then: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second());
    if secs < 0 {
        return "<invalid>".into();
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        let mm = m % 60;
        if mm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{mm}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        let hh = h % 24;
        if hh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{hh}h")
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        let y = d / 365;
        let dd = d % 365;
        if dd == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{dd}d")
        }
    } else {
        format!("{}y", d / 365)
    }
}

/// The Table of a list of objects. `include`: `None`, `Metadata` (the default, as on a real
/// server) or `Object`.
pub fn table(
    rt: &ResourceType,
    items: &[Value],
    rv: u64,
    include: Option<&str>,
    with_columns: bool,
    continue_token: Option<&Value>,
) -> Value {
    let now = Timestamp::now();
    let cols: Vec<Value> = rt
        .print
        .columns()
        .iter()
        .map(|c| json!({"name": c.name, "type": c.kind, "format": c.format, "description": "", "priority": c.priority}))
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let object = match include {
                Some("None") => Value::Null,
                Some("Object") => o.clone(),
                _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata")}),
            };
            json!({"cells": rt.print.cells(o, now), "object": object})
        })
        .collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = continue_token {
        metadata["continue"] = c.clone();
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
        "columnDefinitions": if with_columns { Value::Array(cols) } else { Value::Null }, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_kind_has_a_cell_for_each_column() {
        let now: Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
        let sample =
            json!({"metadata": {"name": "x", "creationTimestamp": "2026-11-22T09:00:00Z"}});
        for rt in crate::apiserver::resources::RESOURCES {
            assert_eq!(
                rt.print.cells(&sample, now).len(),
                rt.print.columns().len(),
                "{}/{}",
                rt.group,
                rt.plural
            );
        }
    }

    #[test]
    fn job_columns_say_status_completions_and_duration() {
        let now: Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
        let job = json!({"spec": {"completions": 3, "parallelism": 1},
            "status": {"succeeded": 3, "startTime": "2026-11-22T09:59:00Z", "completionTime": "2026-11-22T09:59:42Z",
                "conditions": [{"type": "Complete", "status": "True"}]}});
        assert_eq!(job_status(&job), "Complete");
        assert_eq!(job_completions(&job), "3/3");
        assert_eq!(job_duration(&job, now), "42s");
        let queue =
            json!({"spec": {"parallelism": 2}, "status": {"startTime": "2026-11-22T09:59:30Z"}});
        assert_eq!(job_status(&queue), "Running");
        assert_eq!(job_completions(&queue), "0/1 of 2");
        assert_eq!(job_duration(&queue, now), "30s");
    }

    #[test]
    fn selectors_and_lists_print_as_kubectl_prints_them() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}, {"key": "x", "operator": "DoesNotExist"}]});
        assert_eq!(label_selector(Some(&sel)), "app=web,tier in (a,b),!x");
        assert_eq!(label_selector(Some(&json!({}))), "<none>");
        let ips: Vec<String> = (1..=5).map(|i| format!("10.0.0.{i}")).collect();
        assert_eq!(
            three_and_more(&ips),
            "10.0.0.1,10.0.0.2,10.0.0.3 + 2 more..."
        );
        assert_eq!(three_and_more(&[]), "<unset>");
    }

    #[test]
    fn autoscaler_targets_print_as_kubectl_prints_them() {
        let hpa = json!({"spec": {"metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
            {"type": "External", "external": {"metric": {"name": "q"}, "target": {"type": "Value", "value": "10"}}},
        ]}, "status": {"currentMetrics": [
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 12}}},
        ]}});
        assert_eq!(
            hpa_targets(&hpa),
            "cpu: 12%/50%, memory: <unknown>/100Mi + 1 more..."
        );
        assert_eq!(hpa_targets(&json!({"spec": {}})), "<none>");
    }

    #[test]
    fn human_durations_match_apimachinery() {
        let now: Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
        let ago =
            |s: i64| human_duration(now, Timestamp::from_second(now.as_second() - s).unwrap());
        assert_eq!(ago(5), "5s");
        assert_eq!(ago(119), "119s");
        assert_eq!(ago(150), "2m30s");
        assert_eq!(ago(600), "10m");
        assert_eq!(ago(4 * 3600 + 120), "4h2m");
        assert_eq!(ago(30 * 3600), "30h");
        assert_eq!(ago(3 * 86400 + 3600), "3d1h");
        assert_eq!(ago(100 * 86400), "100d");
    }

    #[test]
    fn table_accept_header_is_recognised() {
        assert!(wants_table(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        )));
        assert!(!wants_table(Some("application/json")));
    }
}
