//! Field ownership for server-side apply, to the extent that decides what an apply removes: a
//! field a manager applied before and leaves out of its next apply is removed, unless another
//! manager owns it too. Ownership is recorded in `metadata.managedFields` (operation `Apply`,
//! `fieldsV1`) as kube-apiserver records it, with one simplification: lists are owned whole
//! (atomic), where the real server tracks items of keyed lists one by one. Fields written by
//! other operations (create, update, patch) are not tracked.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A field path: the keys from the object's root.
type Path = Vec<String>;

/// The paths of the leaves `config` sets (maps are walked, anything else is a leaf), leaving
/// out what identifies the object.
fn leaves(config: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(config, &mut Vec::new(), &mut out);
    out.retain(|p| {
        !matches!(
            p.iter().map(String::as_str).collect::<Vec<_>>().as_slice(),
            ["apiVersion"]
                | ["kind"]
                | ["metadata", "name"]
                | ["metadata", "namespace"]
                | ["metadata", "resourceVersion"]
        )
    });
    out
}

/// `fieldsV1` of a set of leaves.
fn fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut node = &mut root;
        for k in p {
            let entry = node.entry(format!("f:{k}")).or_insert_with(|| json!({}));
            let Some(next) = entry.as_object_mut() else {
                break;
            };
            node = next;
        }
    }
    Value::Object(root)
}

/// The leaves of a `fieldsV1` (entries without `f:` children).
fn parse_fields_v1(fields: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let Some(m) = v.as_object() else { return };
        let children: Vec<(&String, &Value)> =
            m.iter().filter(|(k, _)| k.starts_with("f:")).collect();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in children {
            path.push(k.trim_start_matches("f:").to_owned());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

fn entries(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn applied_by(entry: &Value, manager: &str) -> bool {
    entry.get("manager").and_then(Value::as_str) == Some(manager)
        && entry.get("operation").and_then(Value::as_str) == Some("Apply")
}

fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = obj;
    for k in parents {
        match node.get_mut(k.as_str()) {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Some(m) = node.as_object_mut() {
        m.remove(last.as_str());
    }
}

/// Before `config` is merged into `current` by `manager`: removes the fields the manager
/// applied last time and no longer applies (unless another manager's apply owns them).
pub(super) fn remove_dropped_fields(current: &mut Value, manager: &str, config: &Value) {
    let now = leaves(config);
    let all = entries(current);
    let before: BTreeSet<Path> = all
        .iter()
        .filter(|e| applied_by(e, manager))
        .filter_map(|e| e.get("fieldsV1"))
        .flat_map(parse_fields_v1)
        .collect();
    let others: BTreeSet<Path> = all
        .iter()
        .filter(|e| !applied_by(e, manager))
        .filter_map(|e| e.get("fieldsV1"))
        .flat_map(parse_fields_v1)
        .collect();
    for dropped in before.difference(&now) {
        // Still set through a longer path of the new config, or owned by someone else.
        let kept = now.iter().any(|p| p.starts_with(dropped)) || others.contains(dropped);
        if !kept {
            remove_path(current, dropped);
        }
    }
}

/// After the merge: records `manager`'s ownership of what `config` sets.
pub(super) fn record(obj: &mut Value, manager: &str, config: &Value, now: &str) {
    let api_version = obj
        .get("apiVersion")
        .cloned()
        .unwrap_or_else(|| json!("v1"));
    let entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(&leaves(config)),
    });
    // The manager's entry keeps its place, so an apply repeating itself changes nothing but
    // the entry's time (which the no-op check ignores).
    let mut all = entries(obj);
    match all.iter().position(|e| applied_by(e, manager)) {
        Some(i) => {
            all[i] = entry;
            all.retain({
                let mut seen = false;
                move |e| {
                    if !applied_by(e, manager) {
                        return true;
                    }
                    let keep = !seen;
                    seen = true;
                    keep
                }
            });
        }
        None => all.push(entry),
    }
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("managedFields".into(), Value::Array(all));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_the_manager_stops_applying_is_removed_unless_another_owns_it() {
        let first = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "labels": {"l": "1"}}, "data": {"a": "1", "s": "1"}});
        let mut obj = first.clone();
        record(&mut obj, "me", &first, "t");
        record(&mut obj, "other", &json!({"data": {"s": "1"}}), "t");
        let second = json!({"metadata": {"name": "x"}, "data": {"b": "2"}});
        remove_dropped_fields(&mut obj, "me", &second);
        assert_eq!(
            obj["data"],
            json!({"s": "1"}),
            "a is dropped, s is the other's"
        );
        assert!(
            obj["metadata"]
                .get("labels")
                .is_some_and(|l| l.get("l").is_none())
        );
        record(&mut obj, "me", &second, "t");
        let mine = entries(&obj)
            .into_iter()
            .find(|e| applied_by(e, "me"))
            .unwrap();
        assert_eq!(mine["fieldsV1"], json!({"f:data": {"f:b": {}}}));
    }

    #[test]
    fn an_apply_repeated_later_is_a_no_op_whatever_other_managers_wrote_since() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x"}, "data": {"a": "1"}});
        let mut first = config.clone();
        record(&mut first, "me", &config, "2026-01-01T00:00:00Z");
        record(
            &mut first,
            "other",
            &json!({"data": {"s": "1"}}),
            "2026-01-01T00:00:01Z",
        );
        let mut again = first.clone();
        remove_dropped_fields(&mut again, "me", &config);
        record(&mut again, "me", &config, "2026-01-01T00:00:09Z");
        assert_ne!(again, first, "the entry's time moved");
        assert!(super::super::rest::same_object(&again, &first));
    }

    #[test]
    fn fields_v1_reads_back_its_leaves() {
        let config = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [1], "x": {}}});
        let set = leaves(&config);
        assert_eq!(parse_fields_v1(&fields_v1(&set)), set);
    }
}
