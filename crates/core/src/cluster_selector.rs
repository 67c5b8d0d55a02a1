//! The `clusterSelector` pod annotation: the scheduling constraints (nodeSelector, node
//! affinity, tolerations) the webhook hides from the upper scheduler and the virtual node
//! restores on the lower pod.
//!
//! Encoding is byte-compatible with the original's Go `json.Marshal` of
//! `struct { NodeSelector map; Affinity *Affinity; Tolerations []Toleration }`: fields in Go
//! declaration order, `omitempty` where Go has it, map keys sorted, and `<`, `>`, `&`, U+2028,
//! U+2029 escaped as Go does. That matters because the annotation is compared as text (an
//! update rule fires when the text changes) and pods written by the original must decode.
//! Decoding accepts any field order and ignores unknown fields, as Go does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodAffinity,
    PodAffinityTerm, PodAntiAffinity, PreferredSchedulingTerm, Toleration, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::{Deserialize, Serialize};

use crate::keys::ANNOTATION_CLUSTER_SELECTOR;

/// The decoded `clusterSelector` annotation.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSelector {
    /// Node labels the lower scheduler must match.
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_selector: BTreeMap<String, String>,
    /// The affinity for the lower pod (the webhook writes only required node affinity).
    #[serde(default)]
    pub affinity: Option<Affinity>,
    /// The pod's original tolerations, for the lower pod.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tolerations: Vec<Toleration>,
}

/// A `clusterSelector` annotation that cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[error(
    "annotation {ANNOTATION_CLUSTER_SELECTOR:?} is not valid JSON of {{nodeSelector, affinity, tolerations}}: {source}"
)]
pub struct ClusterSelectorError {
    #[source]
    source: serde_json::Error,
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Go's `encoding/json` decodes `null` into a map or slice as nil; serde would refuse it.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

impl ClusterSelector {
    /// Decodes an annotation value. `null` decodes to the empty selector, as in Go.
    pub fn decode(text: &str) -> Result<Self, ClusterSelectorError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|source| ClusterSelectorError { source })?;
        // serde would also accept a struct written as a positional array; Go refuses it.
        if !(value.is_object() || value.is_null()) {
            return Err(ClusterSelectorError {
                source: serde::de::Error::custom(format!(
                    "expected an object, found {}",
                    json_kind(&value)
                )),
            });
        }
        let decoded: Option<Self> =
            serde_json::from_value(value).map_err(|source| ClusterSelectorError { source })?;
        Ok(decoded.unwrap_or_default())
    }

    /// Reads the annotation of an object: `Ok(None)` when it is absent.
    pub fn from_annotations(
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Result<Option<Self>, ClusterSelectorError> {
        annotations
            .and_then(|a| a.get(ANNOTATION_CLUSTER_SELECTOR))
            .map(|text| Self::decode(text))
            .transpose()
    }

    /// Encodes exactly as the original's Go `json.Marshal` does.
    pub fn encode(&self) -> String {
        let go = GoClusterSelector {
            node_selector: non_empty_map(&self.node_selector),
            affinity: self.affinity.as_ref().map(GoAffinity::from),
            tolerations: non_empty(&self.tolerations)
                .map(|t| t.iter().map(GoToleration::from).collect()),
        };
        // Serializing plain structs of strings, integers and maps into a String cannot fail.
        let text = serde_json::to_string(&go).unwrap_or_default();
        go_escape(&text)
    }

    /// Whether it carries no constraint at all.
    pub fn is_empty(&self) -> bool {
        self.node_selector.is_empty() && self.affinity.is_none() && self.tolerations.is_empty()
    }
}

/// Go's encoder escapes these inside strings so JSON can be embedded in HTML; they can only
/// occur inside strings in JSON text, so a plain replacement over the output is exact.
fn go_escape(text: &str) -> String {
    if !text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

fn non_empty<T>(items: &[T]) -> Option<&[T]> {
    (!items.is_empty()).then_some(items)
}

fn non_empty_vec<T>(items: Option<&Vec<T>>) -> Option<&[T]> {
    items.map(Vec::as_slice).and_then(non_empty)
}

fn non_empty_map(map: &BTreeMap<String, String>) -> Option<&BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

/// Go's `omitempty` on a string drops the empty string too.
fn non_empty_str(s: Option<&String>) -> Option<&str> {
    s.map(String::as_str).filter(|s| !s.is_empty())
}

// Mirrors of the Kubernetes Go types with fields in Go declaration order and Go's omitempty
// rules; k8s-openapi serializes in alphabetical order, which is not what the original wrote.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoClusterSelector<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    node_selector: Option<&'a BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    affinity: Option<GoAffinity<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tolerations: Option<Vec<GoToleration<'a>>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoToleration<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    operator: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    effect: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    toleration_seconds: Option<i64>,
}

impl<'a> From<&'a Toleration> for GoToleration<'a> {
    fn from(t: &'a Toleration) -> Self {
        Self {
            key: non_empty_str(t.key.as_ref()),
            operator: non_empty_str(t.operator.as_ref()),
            value: non_empty_str(t.value.as_ref()),
            effect: non_empty_str(t.effect.as_ref()),
            toleration_seconds: t.toleration_seconds,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoAffinity<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    node_affinity: Option<GoNodeAffinity<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_affinity: Option<GoPodAffinity<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_anti_affinity: Option<GoPodAffinity<'a>>,
}

impl<'a> From<&'a Affinity> for GoAffinity<'a> {
    fn from(a: &'a Affinity) -> Self {
        Self {
            node_affinity: a.node_affinity.as_ref().map(GoNodeAffinity::from),
            pod_affinity: a.pod_affinity.as_ref().map(GoPodAffinity::from),
            pod_anti_affinity: a.pod_anti_affinity.as_ref().map(GoPodAffinity::from_anti),
        }
    }
}

#[derive(Serialize)]
struct GoNodeAffinity<'a> {
    #[serde(
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    required: Option<GoNodeSelector<'a>>,
    #[serde(
        rename = "preferredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    preferred: Option<Vec<GoPreferredSchedulingTerm<'a>>>,
}

impl<'a> From<&'a NodeAffinity> for GoNodeAffinity<'a> {
    fn from(n: &'a NodeAffinity) -> Self {
        Self {
            required: n
                .required_during_scheduling_ignored_during_execution
                .as_ref()
                .map(|s: &'a NodeSelector| GoNodeSelector {
                    node_selector_terms: s.node_selector_terms.iter().map(GoTerm::from).collect(),
                }),
            preferred: non_empty_vec(
                n.preferred_during_scheduling_ignored_during_execution
                    .as_ref(),
            )
            .map(|p| {
                p.iter()
                    .map(|t: &'a PreferredSchedulingTerm| GoPreferredSchedulingTerm {
                        weight: t.weight,
                        preference: GoTerm::from(&t.preference),
                    })
                    .collect()
            }),
        }
    }
}

/// `NodeSelectorTerms` has no omitempty in Go, so an empty list is written as `[]`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoNodeSelector<'a> {
    node_selector_terms: Vec<GoTerm<'a>>,
}

#[derive(Serialize)]
struct GoPreferredSchedulingTerm<'a> {
    weight: i32,
    preference: GoTerm<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoTerm<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    match_expressions: Option<Vec<GoRequirement<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    match_fields: Option<Vec<GoRequirement<'a>>>,
}

impl<'a> From<&'a NodeSelectorTerm> for GoTerm<'a> {
    fn from(t: &'a NodeSelectorTerm) -> Self {
        let reqs = |r: Option<&'a Vec<NodeSelectorRequirement>>| {
            non_empty_vec(r).map(|r| r.iter().map(GoRequirement::from).collect())
        };
        Self {
            match_expressions: reqs(t.match_expressions.as_ref()),
            match_fields: reqs(t.match_fields.as_ref()),
        }
    }
}

/// Both `NodeSelectorRequirement` and `LabelSelectorRequirement` are `key, operator, values`.
#[derive(Serialize)]
struct GoRequirement<'a> {
    key: &'a str,
    operator: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    values: Option<&'a [String]>,
}

impl<'a> From<&'a NodeSelectorRequirement> for GoRequirement<'a> {
    fn from(r: &'a NodeSelectorRequirement) -> Self {
        Self {
            key: &r.key,
            operator: &r.operator,
            values: non_empty_vec(r.values.as_ref()),
        }
    }
}

impl<'a> From<&'a LabelSelectorRequirement> for GoRequirement<'a> {
    fn from(r: &'a LabelSelectorRequirement) -> Self {
        Self {
            key: &r.key,
            operator: &r.operator,
            values: non_empty_vec(r.values.as_ref()),
        }
    }
}

#[derive(Serialize)]
struct GoPodAffinity<'a> {
    #[serde(
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    required: Option<Vec<GoPodAffinityTerm<'a>>>,
    #[serde(
        rename = "preferredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Option::is_none"
    )]
    preferred: Option<Vec<GoWeightedPodAffinityTerm<'a>>>,
}

impl<'a> GoPodAffinity<'a> {
    fn new(
        required: Option<&'a Vec<PodAffinityTerm>>,
        preferred: Option<&'a Vec<WeightedPodAffinityTerm>>,
    ) -> Self {
        Self {
            required: non_empty_vec(required)
                .map(|r| r.iter().map(GoPodAffinityTerm::from).collect()),
            preferred: non_empty_vec(preferred).map(|p| {
                p.iter()
                    .map(|w| GoWeightedPodAffinityTerm {
                        weight: w.weight,
                        pod_affinity_term: GoPodAffinityTerm::from(&w.pod_affinity_term),
                    })
                    .collect()
            }),
        }
    }

    fn from_anti(a: &'a PodAntiAffinity) -> Self {
        Self::new(
            a.required_during_scheduling_ignored_during_execution
                .as_ref(),
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref(),
        )
    }
}

impl<'a> From<&'a PodAffinity> for GoPodAffinity<'a> {
    fn from(a: &'a PodAffinity) -> Self {
        Self::new(
            a.required_during_scheduling_ignored_during_execution
                .as_ref(),
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref(),
        )
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoWeightedPodAffinityTerm<'a> {
    weight: i32,
    pod_affinity_term: GoPodAffinityTerm<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoPodAffinityTerm<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    label_selector: Option<GoLabelSelector<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespaces: Option<&'a [String]>,
    topology_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace_selector: Option<GoLabelSelector<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    match_label_keys: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mismatch_label_keys: Option<&'a [String]>,
}

impl<'a> From<&'a PodAffinityTerm> for GoPodAffinityTerm<'a> {
    fn from(t: &'a PodAffinityTerm) -> Self {
        Self {
            label_selector: t.label_selector.as_ref().map(GoLabelSelector::from),
            namespaces: non_empty_vec(t.namespaces.as_ref()),
            topology_key: &t.topology_key,
            namespace_selector: t.namespace_selector.as_ref().map(GoLabelSelector::from),
            match_label_keys: non_empty_vec(t.match_label_keys.as_ref()),
            mismatch_label_keys: non_empty_vec(t.mismatch_label_keys.as_ref()),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GoLabelSelector<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    match_labels: Option<&'a BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    match_expressions: Option<Vec<GoRequirement<'a>>>,
}

impl<'a> From<&'a LabelSelector> for GoLabelSelector<'a> {
    fn from(s: &'a LabelSelector) -> Self {
        Self {
            match_labels: s.match_labels.as_ref().and_then(non_empty_map),
            match_expressions: non_empty_vec(s.match_expressions.as_ref())
                .map(|e| e.iter().map(GoRequirement::from).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An example value, as the original's webhook writes it.
    const ORIGINAL_EXAMPLE: &str = r#"{"nodeSelector":{"disk":"ssd"},"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}},"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]}"#;

    fn toleration(key: &str, op: &str, effect: &str, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some(op.into()),
            effect: Some(effect.into()),
            toleration_seconds: secs,
            value: None,
        }
    }

    #[test]
    fn webhook_codec_decodes_the_originals_example() {
        let cs = ClusterSelector::decode(ORIGINAL_EXAMPLE).unwrap();
        assert_eq!(
            cs.node_selector,
            BTreeMap::from([("disk".into(), "ssd".into())])
        );
        let terms = &cs
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .unwrap()
            .node_selector_terms;
        let expr = &terms[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!((expr.key.as_str(), expr.operator.as_str()), ("zone", "In"));
        assert_eq!(
            cs.tolerations,
            vec![toleration(
                "node.kubernetes.io/not-ready",
                "Exists",
                "NoExecute",
                Some(300)
            )]
        );
    }

    #[test]
    fn webhook_codec_encodes_byte_for_byte_like_the_original() {
        let cs = ClusterSelector::decode(ORIGINAL_EXAMPLE).unwrap();
        assert_eq!(cs.encode(), ORIGINAL_EXAMPLE);
    }

    #[test]
    fn webhook_codec_omits_empty_fields_like_go() {
        assert_eq!(ClusterSelector::default().encode(), "{}");
        let cs = ClusterSelector {
            tolerations: vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(cs.encode(), r#"{"tolerations":[{"operator":"Exists"}]}"#);
        // Empty strings are omitted by Go's omitempty.
        let cs = ClusterSelector {
            tolerations: vec![Toleration {
                key: Some(String::new()),
                operator: Some("Exists".into()),
                value: Some(String::new()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(cs.encode(), r#"{"tolerations":[{"operator":"Exists"}]}"#);
    }

    #[test]
    fn webhook_codec_writes_empty_node_selector_terms_as_an_empty_list() {
        let cs = ClusterSelector {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            cs.encode(),
            r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[]}}}}"#
        );
    }

    #[test]
    fn webhook_codec_orders_pod_affinity_fields_like_go() {
        let term = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into()]),
                }]),
            }),
            namespaces: Some(vec!["ns".into()]),
            topology_key: "zone".into(),
            ..Default::default()
        };
        let cs = ClusterSelector {
            affinity: Some(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 5,
                            pod_affinity_term: term,
                        },
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            cs.encode(),
            r#"{"affinity":{"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":5,"podAffinityTerm":{"labelSelector":{"matchLabels":{"app":"web"},"matchExpressions":[{"key":"tier","operator":"In","values":["a"]}]},"namespaces":["ns"],"topologyKey":"zone"}}]}}}"#
        );
    }

    #[test]
    fn webhook_codec_escapes_html_characters_like_go() {
        let cs = ClusterSelector {
            node_selector: BTreeMap::from([("k".into(), "a<b>&c".into())]),
            ..Default::default()
        };
        assert_eq!(
            cs.encode(),
            r#"{"nodeSelector":{"k":"a\u003cb\u003e\u0026c"}}"#
        );
        assert_eq!(ClusterSelector::decode(&cs.encode()).unwrap(), cs);
    }

    #[test]
    fn webhook_codec_accepts_null_any_field_order_and_unknown_fields() {
        assert_eq!(
            ClusterSelector::decode("null").unwrap(),
            ClusterSelector::default()
        );
        let cs = ClusterSelector::decode(
            r#"{"tolerations":null,"extra":1,"nodeSelector":{"a":"b"},"affinity":null}"#,
        )
        .unwrap();
        assert_eq!(cs.node_selector.len(), 1);
        assert!(cs.tolerations.is_empty() && cs.affinity.is_none());
    }

    #[test]
    fn webhook_codec_malformed_input_is_a_typed_error() {
        for bad in [
            "",
            "{",
            "[]",
            "\"x\"",
            r#"{"nodeSelector":[1]}"#,
            r#"{"tolerations":{}}"#,
        ] {
            let err = ClusterSelector::decode(bad).unwrap_err();
            assert!(err.to_string().contains("clusterSelector"), "{bad}: {err}");
        }
    }

    #[test]
    fn annotation_absent_is_none_and_present_is_decoded() {
        assert!(ClusterSelector::from_annotations(None).unwrap().is_none());
        let ann = BTreeMap::from([(ANNOTATION_CLUSTER_SELECTOR.to_owned(), "{}".to_owned())]);
        assert_eq!(
            ClusterSelector::from_annotations(Some(&ann)).unwrap(),
            Some(ClusterSelector::default())
        );
    }

    fn word() -> impl Strategy<Value = String> {
        "[a-z<>&][a-z0-9./-]{0,8}"
    }

    fn arb_requirement() -> impl Strategy<Value = NodeSelectorRequirement> {
        (
            word(),
            prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
            prop::collection::vec(word(), 1..3),
        )
            .prop_map(|(key, op, values)| NodeSelectorRequirement {
                key,
                operator: op.into(),
                values: (!matches!(op, "Exists" | "DoesNotExist")).then_some(values),
            })
    }

    fn arb_term() -> impl Strategy<Value = NodeSelectorTerm> {
        (
            prop::collection::vec(arb_requirement(), 1..3),
            prop::option::of(prop::collection::vec(arb_requirement(), 1..2)),
        )
            .prop_map(|(e, f)| NodeSelectorTerm {
                match_expressions: Some(e),
                match_fields: f,
            })
    }

    fn arb_toleration() -> impl Strategy<Value = Toleration> {
        (
            prop::option::of(word()),
            prop::sample::select(vec!["Exists", "Equal"]),
            prop::option::of(word()),
            prop::option::of(prop::sample::select(vec!["NoSchedule", "NoExecute"])),
            prop::option::of(0i64..100_000),
        )
            .prop_map(|(key, op, value, effect, secs)| Toleration {
                key,
                operator: Some(op.into()),
                value,
                effect: effect.map(Into::into),
                toleration_seconds: secs,
            })
    }

    fn arb_selector() -> impl Strategy<Value = ClusterSelector> {
        (
            prop::collection::btree_map(word(), word(), 0..4),
            prop::option::of(prop::collection::vec(arb_term(), 0..3)),
            prop::collection::vec(arb_toleration(), 0..4),
        )
            .prop_map(|(node_selector, terms, tolerations)| ClusterSelector {
                node_selector,
                affinity: terms.map(|node_selector_terms| Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms,
                        }),
                        preferred_during_scheduling_ignored_during_execution: None,
                    }),
                    ..Default::default()
                }),
                tolerations,
            })
    }

    /// Go's omitempty turns empty strings into absent fields; compare after the same rule.
    fn normalized(mut cs: ClusterSelector) -> ClusterSelector {
        for t in &mut cs.tolerations {
            for f in [&mut t.key, &mut t.value] {
                if f.as_deref() == Some("") {
                    *f = None;
                }
            }
        }
        cs
    }

    proptest! {
        #[test]
        fn webhook_codec_round_trips(cs in arb_selector()) {
            let text = cs.encode();
            let back = ClusterSelector::decode(&text).unwrap();
            prop_assert_eq!(&normalized(back.clone()), &normalized(cs));
            // Encoding is a fixed point: what we decode we write back byte for byte.
            prop_assert_eq!(back.encode(), text);
        }

        #[test]
        fn webhook_codec_never_panics_on_arbitrary_text(text in ".{0,64}") {
            let _ = ClusterSelector::decode(&text);
        }
    }
}
