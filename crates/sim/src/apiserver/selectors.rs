//! (interim, replaced by the full parser being written) equality-based selectors only.
use std::collections::BTreeMap;

/// A parsed selector.
#[derive(Clone, Debug, Default)]
pub struct Selector(Vec<(String, bool, String)>);

/// Parse failure.
#[derive(Debug, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(String);

/// Parses `a=b,c!=d`.
pub fn parse(s: &str) -> Result<Selector, SelectorError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((k, v)) = part.split_once("!=") {
            out.push((k.trim().to_owned(), false, v.trim().to_owned()));
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            out.push((k.trim().to_owned(), true, v.trim().to_owned()));
        } else {
            return Err(SelectorError(part.to_owned()));
        }
    }
    Ok(Selector(out))
}

impl Selector {
    /// Keys used.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _, _)| k.as_str())
    }
    /// Whether `get` satisfies every requirement.
    pub fn matches_with(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0
            .iter()
            .all(|(k, eq, v)| (get(k).as_deref().unwrap_or("") == v) == *eq)
    }
    /// Label matching.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).cloned())
    }
}
