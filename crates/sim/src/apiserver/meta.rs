//! Small helpers over objects held as JSON: metadata access, timestamps, UIDs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

/// Now, as Kubernetes writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    time_string(Timestamp::now())
}

/// Now, as Kubernetes writes MicroTime fields (`eventTime`: microseconds, UTC).
pub fn now_micro() -> String {
    Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

/// A timestamp as Kubernetes writes it.
pub fn time_string(t: Timestamp) -> String {
    match serde_json::to_value(Time(t)) {
        Ok(Value::String(s)) => s,
        _ => t.to_string(),
    }
}

/// Parses a Kubernetes timestamp.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

static UID_STATE: AtomicU64 = AtomicU64::new(0);

/// A random-looking, unique UUID (version 4 layout). Uniqueness is what matters for UIDs;
/// a splitmix64 sequence seeded from the clock gives that without a dependency.
pub fn new_uid() -> String {
    let seed = UID_STATE.load(Ordering::Relaxed);
    if seed == 0 {
        let clock = Timestamp::now().as_nanosecond() as u64;
        let _ = UID_STATE.compare_exchange(0, clock | 1, Ordering::Relaxed, Ordering::Relaxed);
    }
    let a = splitmix(UID_STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed));
    let b = splitmix(a ^ 0xdead_beef_cafe_f00d);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// A short random suffix of lowercase consonants and digits, as `generateName` uses.
pub fn random_suffix(len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = splitmix(UID_STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed) ^ 0x5555);
    (0..len)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
            x /= ALPHABET.len() as u64;
            if x == 0 {
                x = splitmix(c as u64 ^ 0x1234_5678);
            }
            c as char
        })
        .collect()
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `metadata`, created (and the object made an object) if missing.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(map) = obj else {
        unreachable!("made an object above")
    };
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    let Value::Object(meta) = meta else {
        unreachable!("made an object above")
    };
    meta
}

/// A string at `metadata.<field>`.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// The object's name.
pub fn name(obj: &Value) -> Option<&str> {
    meta_str(obj, "name").filter(|s| !s.is_empty())
}

/// The object's namespace.
pub fn namespace(obj: &Value) -> Option<&str> {
    meta_str(obj, "namespace").filter(|s| !s.is_empty())
}

/// The object's labels.
pub fn labels(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj.get("metadata").and_then(|m| m.get("labels")))
}

/// A JSON object of strings as a map (other values are skipped).
pub fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The string value at a dotted path (`spec.nodeName`); booleans and numbers as text.
pub fn path_str(obj: &Value, path: &str) -> Option<String> {
    let mut v = obj;
    for part in path.split('.') {
        v = v.get(part)?;
    }
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The finalizers of an object.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the object is being deleted.
pub fn deleting(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uids_are_unique_uuid_shaped() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn timestamps_are_whole_seconds() {
        let t = now();
        assert!(t.ends_with('Z') && t.len() == 20, "{t}");
        assert!(parse_time(&t).is_some());
    }

    #[test]
    fn paths_and_maps() {
        let v = json!({"metadata": {"labels": {"a": "b", "n": 1}}, "spec": {"hostNetwork": true}});
        assert_eq!(labels(&v).len(), 1);
        assert_eq!(path_str(&v, "spec.hostNetwork").as_deref(), Some("true"));
        let mut w = json!({});
        meta_mut(&mut w).insert("name".into(), json!("x"));
        assert_eq!(name(&w), Some("x"));
        assert_eq!(random_suffix(5).len(), 5);
    }
}
