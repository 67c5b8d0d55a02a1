//! Label and field selectors as the Kubernetes API server understands them.
//!
//! Label selectors follow `k8s.io/apimachinery/pkg/labels` of Kubernetes 1.33 (the version the
//! simulated API server stands for): the same tokenizer, the same grammar, the same validation of
//! keys and values, the same error texts (the server puts them in a 400 `Status`). Field selectors
//! follow `k8s.io/apimachinery/pkg/fields`: `field=value`, `field==value` and `field!=value`
//! terms joined by commas, with `\` escaping in values.
//!
//! Everything here is pure: no I/O, no allocation beyond the values built.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::Value;

/// Why a selector could not be parsed or built. The `Display` text is the upstream message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A requirement of a label selector string is malformed or invalid (upstream wraps every
    /// requirement-level error this way).
    #[error("unable to parse requirement: {0}")]
    Requirement(String),
    /// The label selector string has a token where the grammar allows none.
    #[error("{0}")]
    Syntax(String),
    /// A requirement built from parts (for example a `matchExpressions` entry) is invalid: the
    /// aggregated field errors of upstream `NewRequirement`.
    #[error("{0}")]
    InvalidRequirement(String),
    /// A `matchExpressions` entry has an operator other than In, NotIn, Exists, DoesNotExist.
    #[error("{} is not a valid label selector operator", go_quote(.0))]
    InvalidOperator(String),
    /// A `metav1.LabelSelector` document is not shaped as the type says.
    #[error("invalid label selector: {0}")]
    Malformed(String),
    /// A field selector term has no `=`, `==` or `!=`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm {
        /// The whole selector.
        selector: String,
        /// The term that could not be understood.
        term: String,
    },
    /// A field selector value has a backslash not followed by `\`, `,` or `=`.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    InvalidEscape(String),
    /// A field selector value has an unescaped `=` (upstream prints the code point).
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.0))]
    UnescapedCharacter(char),
    /// The field is not selectable for the resource (the server's conversion function said no).
    #[error("field label not supported: {0}")]
    FieldLabelNotSupported(String),
}

// ---------------------------------------------------------------------------------------------
// Labels
// ---------------------------------------------------------------------------------------------

/// A set of labels a selector can be matched against.
pub trait Labels {
    /// The value of `key`, if the label is present.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<S: std::hash::BuildHasher> Labels for HashMap<String, String, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// A JSON object such as `metadata.labels`; members that are not strings count as absent.
impl Labels for serde_json::Map<String, Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// A JSON value: an object is a label map, anything else (`null`, absent labels) has no labels.
impl Labels for Value {
    fn label(&self, key: &str) -> Option<&str> {
        self.as_object().and_then(|m| m.label(key))
    }
}

/// The operator of one label requirement (`k8s.io/apimachinery/pkg/selection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value`
    Equals,
    /// `key==value`
    DoubleEquals,
    /// `key!=value`
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>1` (integers only)
    GreaterThan,
    /// `key<1` (integers only)
    LessThan,
}

impl Operator {
    /// The upstream `selection.Operator` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Equals => "=",
            Self::DoubleEquals => "==",
            Self::NotEquals => "!=",
            Self::In => "in",
            Self::NotIn => "notin",
            Self::Exists => "exists",
            Self::DoesNotExist => "!",
            Self::GreaterThan => "gt",
            Self::LessThan => "lt",
        }
    }
}

/// One requirement of a label selector: a key, an operator and the values it compares with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement, validating it as upstream `labels.NewRequirement` does: the key is a
    /// qualified name, values are label values, the number of values fits the operator, `Gt` and
    /// `Lt` take one integer.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Self, SelectorError> {
        let key = key.into();
        let mut errs: Vec<String> = Vec::new();
        let key_errs = qualified_name_errors(&key);
        if !key_errs.is_empty() {
            errs.push(invalid_string("key", &key, &key_errs.join("; ")));
        }
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => errs.push(invalid_list(
                "values",
                &values,
                "for 'in', 'notin' operators, values set can't be empty",
            )),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals
                if values.len() != 1 =>
            {
                errs.push(invalid_list(
                    "values",
                    &values,
                    "exact-match compatibility requires one single value",
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                errs.push(invalid_list(
                    "values",
                    &values,
                    "values set must be empty for exists and does not exist",
                ));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(invalid_list(
                        "values",
                        &values,
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if parse_go_int(v).is_none() {
                        errs.push(invalid_string(
                            &format!("values[{i}]"),
                            v,
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
            _ => {}
        }
        for (i, v) in values.iter().enumerate() {
            let value_errs = label_value_errors(v);
            if !value_errs.is_empty() {
                errs.push(invalid_string(
                    &format!("values[{i}][{key}]"),
                    v,
                    &value_errs.join("; "),
                ));
            }
        }
        if errs.is_empty() {
            Ok(Self {
                key,
                operator,
                values,
            })
        } else {
            Err(SelectorError::InvalidRequirement(aggregate(errs)))
        }
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, in the order given (sorted and unique when parsed from a string).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether the labels satisfy this requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                labels.label(&self.key).is_some_and(has)
            }
            Operator::NotIn | Operator::NotEquals => !labels.label(&self.key).is_some_and(has),
            Operator::Exists => labels.label(&self.key).is_some(),
            Operator::DoesNotExist => labels.label(&self.key).is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(actual) = labels.label(&self.key).and_then(parse_go_int) else {
                    return false;
                };
                let [wanted] = self.values.as_slice() else {
                    return false;
                };
                let Some(wanted) = parse_go_int(wanted) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > wanted
                } else {
                    actual < wanted
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let (op, parens) = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => ("=", false),
            Operator::DoubleEquals => ("==", false),
            Operator::NotEquals => ("!=", false),
            Operator::In => (" in ", true),
            Operator::NotIn => (" notin ", true),
            Operator::GreaterThan => (">", false),
            Operator::LessThan => ("<", false),
        };
        f.write_str(op)?;
        if parens {
            f.write_str("(")?;
        }
        // Upstream prints values sorted without changing the requirement itself.
        let mut values: Vec<&str> = self.values.iter().map(String::as_str).collect();
        values.sort_unstable();
        f.write_str(&values.join(","))?;
        if parens {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A label selector: requirements that must all hold, or the selector that matches nothing (a
/// `null` `metav1.LabelSelector`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

/// Parses a label selector string as the API server does for `?labelSelector=`.
pub fn parse_label_selector(selector: &str) -> Result<LabelSelector, SelectorError> {
    LabelSelector::parse(selector)
}

impl LabelSelector {
    /// The selector that matches every object (the empty string).
    pub fn everything() -> Self {
        Self::default()
    }

    /// The selector that matches no object.
    pub fn nothing() -> Self {
        Self {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// Parses a label selector string (upstream `labels.Parse`).
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let tokens = lex(selector.as_bytes());
        let mut parser = Parser { tokens, pos: 0 };
        let mut requirements = parser.parse()?;
        // Upstream sorts by key so that equal selectors print equally.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self {
            requirements,
            nothing: false,
        })
    }

    /// Builds a selector from requirements (sorted by key, as upstream `Add` does).
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Self {
            requirements,
            nothing: false,
        }
    }

    /// The selector of a plain label map (`Service.spec.selector`, upstream `SelectorFromSet`):
    /// `key=value` for every entry, not validated. An empty map matches everything.
    pub fn from_set<'a>(set: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        let requirements = set
            .into_iter()
            .map(|(k, v)| Requirement {
                key: k.clone(),
                operator: Operator::Equals,
                values: vec![v.clone()],
            })
            .collect();
        Self::from_requirements(requirements)
    }

    /// Converts a `metav1.LabelSelector` JSON document (upstream `LabelSelectorAsSelector`):
    /// `null` matches nothing, `{}` matches everything, `matchLabels` become `key=value`,
    /// `matchExpressions` allow In, NotIn, Exists and DoesNotExist only.
    pub fn from_label_selector(value: &Value) -> Result<Self, SelectorError> {
        let obj = match value {
            Value::Null => return Ok(Self::nothing()),
            Value::Object(obj) => obj,
            other => {
                return Err(SelectorError::Malformed(format!(
                    "expected an object, got {}",
                    json_type(other)
                )));
            }
        };
        let mut requirements = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                // Go iterates the map in random order; sorted keys make the first error stable.
                let mut entries: Vec<(&String, &Value)> = labels.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                for (k, v) in entries {
                    let Some(v) = v.as_str() else {
                        return Err(SelectorError::Malformed(format!(
                            "matchLabels[{k}] must be a string, got {}",
                            json_type(v)
                        )));
                    };
                    requirements.push(Requirement::new(
                        k.clone(),
                        Operator::Equals,
                        vec![v.to_owned()],
                    )?);
                }
            }
            Some(other) => {
                return Err(SelectorError::Malformed(format!(
                    "matchLabels must be an object, got {}",
                    json_type(other)
                )));
            }
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => {
                for (i, expr) in exprs.iter().enumerate() {
                    requirements.push(expression_requirement(i, expr)?);
                }
            }
            Some(other) => {
                return Err(SelectorError::Malformed(format!(
                    "matchExpressions must be an array, got {}",
                    json_type(other)
                )));
            }
        }
        Ok(Self::from_requirements(requirements))
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether the selector matches everything (no requirement, not the nothing selector).
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// Whether this is the selector that matches nothing.
    pub fn matches_nothing(&self) -> bool {
        self.nothing
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches_object(&self, object: &Value) -> bool {
        let labels = object
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .unwrap_or(&Value::Null);
        self.matches(labels)
    }

    /// The single value `key` must have, if the selector pins it (`=`, `==` or a one-value `in`).
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| r.key == key)?;
        match (r.operator, r.values.as_slice()) {
            (Operator::Equals | Operator::DoubleEquals | Operator::In, [v]) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

fn expression_requirement(index: usize, expr: &Value) -> Result<Requirement, SelectorError> {
    let Some(expr) = expr.as_object() else {
        return Err(SelectorError::Malformed(format!(
            "matchExpressions[{index}] must be an object, got {}",
            json_type(expr)
        )));
    };
    let text = |name: &str| -> Result<String, SelectorError> {
        match expr.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(SelectorError::Malformed(format!(
                "matchExpressions[{index}].{name} must be a string, got {}",
                json_type(other)
            ))),
        }
    };
    let key = text("key")?;
    let operator = text("operator")?;
    let op = match operator.as_str() {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        _ => return Err(SelectorError::InvalidOperator(operator)),
    };
    let values = match expr.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut values = Vec::with_capacity(items.len());
            for item in items {
                let Some(s) = item.as_str() else {
                    return Err(SelectorError::Malformed(format!(
                        "matchExpressions[{index}].values must hold strings, got {}",
                        json_type(item)
                    )));
                };
                values.push(s.to_owned());
            }
            values
        }
        Some(other) => {
            return Err(SelectorError::Malformed(format!(
                "matchExpressions[{index}].values must be an array, got {}",
                json_type(other)
            )));
        }
    };
    Requirement::new(key, op, values)
}

// ---------------------------------------------------------------------------------------------
// Label selector lexer and parser (the upstream state machine, byte for byte)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(s: &[u8]) -> Option<Tok> {
    Some(match s {
        b")" => Tok::ClosedPar,
        b"," => Tok::Comma,
        b"!" => Tok::DoesNotExist,
        b"==" => Tok::DoubleEquals,
        b"=" => Tok::Equals,
        b">" => Tok::GreaterThan,
        b"in" => Tok::In,
        b"<" => Tok::LessThan,
        b"!=" => Tok::NotEquals,
        b"notin" => Tok::NotIn,
        b"(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    // Upstream reads a 0 byte both at the end and for a NUL in the input; both end a token.
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn lex(&mut self) -> (Tok, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Tok::EndOfString, String::new());
        }
        self.unread();
        if is_special(ch) {
            self.special()
        } else {
            self.identifier()
        }
    }

    fn identifier(&mut self) -> (Tok, String) {
        let start = self.pos;
        let mut end = start;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            end = self.pos;
        }
        let word = self.s.get(start..end).unwrap_or_default();
        let text = String::from_utf8_lossy(word).into_owned();
        match keyword(word) {
            Some(tok) => (tok, text),
            None => (Tok::Identifier, text),
        }
    }

    // The longest run of special characters that is still a token.
    fn special(&mut self) -> (Tok, String) {
        let start = self.pos;
        let mut last: Option<(Tok, usize)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special(ch) {
                self.unread();
                break;
            }
            let buf = self.s.get(start..self.pos).unwrap_or_default();
            if let Some(tok) = keyword(buf) {
                last = Some((tok, self.pos));
            } else if last.is_some() {
                self.unread();
                break;
            }
        }
        match last {
            Some((tok, end)) => {
                let text = self.s.get(start..end).unwrap_or_default();
                (tok, String::from_utf8_lossy(text).into_owned())
            }
            // Unreachable with the current token set (every special byte is a token alone).
            None => (Tok::Identifier, String::new()),
        }
    }
}

fn lex(s: &[u8]) -> Vec<(Tok, String)> {
    let mut lexer = Lexer { s, pos: 0 };
    let mut out = Vec::new();
    loop {
        let (tok, lit) = lexer.lex();
        out.push((tok, lit));
        if tok == Tok::EndOfString {
            return out;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

struct Parser {
    tokens: Vec<(Tok, String)>,
    pos: usize,
}

const BINARY_OPERATORS: &str = "in, notin, =, ==, !=, gt, lt";

impl Parser {
    fn peek(&self, ctx: Ctx) -> (Tok, String) {
        let (tok, lit) = self
            .tokens
            .get(self.pos)
            .cloned()
            .unwrap_or((Tok::EndOfString, String::new()));
        // In value position `in` and `notin` are plain identifiers.
        match (ctx, tok) {
            (Ctx::Values, Tok::In | Tok::NotIn) => (Tok::Identifier, lit),
            _ => (tok, lit),
        }
    }

    fn next(&mut self, ctx: Ctx) -> (Tok, String) {
        let item = self.peek(ctx);
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut out = Vec::new();
        loop {
            let (tok, lit) = self.peek(Ctx::Values);
            match tok {
                Tok::Identifier | Tok::DoesNotExist => {
                    let r = self.requirement().map_err(SelectorError::Requirement)?;
                    out.push(r);
                    let (t, l) = self.next(Ctx::Values);
                    match t {
                        Tok::EndOfString => return Ok(out),
                        Tok::Comma => {
                            let (t2, l2) = self.peek(Ctx::Values);
                            if t2 != Tok::Identifier && t2 != Tok::DoesNotExist {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Tok::EndOfString => return Ok(out),
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    // Errors here are the inner text; the caller adds "unable to parse requirement: ".
    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, op) = self.key_and_inferred_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = op {
            return Requirement::new(key, op, Vec::new()).map_err(|e| e.to_string());
        }
        let op = self.operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.values()?,
            _ => self.exact_value()?,
        };
        Requirement::new(key, op, values).map_err(|e| e.to_string())
    }

    fn key_and_inferred_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.next(Ctx::Values);
        if tok == Tok::DoesNotExist {
            op = Some(Operator::DoesNotExist);
            (tok, lit) = self.next(Ctx::Values);
        }
        if tok != Tok::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let errs = qualified_name_errors(&lit);
        if !errs.is_empty() {
            // Upstream validates with a nil field path here, which prints as "<nil>".
            return Err(invalid_string("<nil>", &lit, &errs.join("; ")));
        }
        let (next, _) = self.peek(Ctx::Values);
        if matches!(next, Tok::EndOfString | Tok::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        Ok((lit, op))
    }

    fn operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.next(Ctx::KeyAndOperator);
        Ok(match tok {
            Tok::In => Operator::In,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::GreaterThan => Operator::GreaterThan,
            Tok::LessThan => Operator::LessThan,
            Tok::NotIn => Operator::NotIn,
            Tok::NotEquals => Operator::NotEquals,
            _ => return Err(format!("found '{lit}', expected: {BINARY_OPERATORS}")),
        })
    }

    // `(a,b,...)`; values are a set, returned sorted as upstream `sets.String.List()` does.
    fn values(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.next(Ctx::Values);
        if tok != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.peek(Ctx::Values);
        match tok {
            Tok::Identifier | Tok::Comma => {
                let set = self.identifiers()?;
                let (tok, _) = self.next(Ctx::Values);
                if tok != Tok::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Tok::ClosedPar => {
                self.next(Ctx::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    fn identifiers(&mut self) -> Result<Vec<String>, String> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (tok, lit) = self.next(Ctx::Values);
            match tok {
                Tok::Identifier => {
                    set.insert(lit);
                    let (tok2, lit2) = self.peek(Ctx::Values);
                    match tok2 {
                        Tok::Comma => {}
                        Tok::ClosedPar => return Ok(set.into_iter().collect()),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    if set.is_empty() {
                        set.insert(String::new()); // "(,"
                    }
                    let (tok2, _) = self.peek(Ctx::Values);
                    if tok2 == Tok::ClosedPar {
                        set.insert(String::new()); // ",)"
                        return Ok(set.into_iter().collect());
                    }
                    if tok2 == Tok::Comma {
                        // ",,": Kubernetes 1.33 also consumes the second comma here.
                        self.next(Ctx::Values);
                        set.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, String> {
        let (tok, _) = self.peek(Ctx::Values);
        if matches!(tok, Tok::EndOfString | Tok::Comma) {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.next(Ctx::Values);
        if tok == Tok::Identifier {
            Ok(vec![lit])
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validation (k8s.io/apimachinery/pkg/util/validation) and Go-style error formatting
// ---------------------------------------------------------------------------------------------

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and \
                                  must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric \
                               characters, '-', '_' or '.', and must start and end with an \
                               alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
                                     alphanumeric characters, '-' or '.', and must start and end \
                                     with an alphanumeric character";

// Upstream `validation.RegexError`, whose example list reads "'a',  or 'b', " (sic).
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, anchored.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => ok(first) && ok(last) && b.iter().all(|c| ok(c) || *c == b'-'),
        _ => false,
    }
}

fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !s.split('.').all(is_dns1123_label) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Upstream `validation.IsQualifiedName`: an optional DNS subdomain prefix and `/`, then a name
/// of at most 63 characters.
fn qualified_name_errors(value: &str) -> Vec<String> {
    let name_examples = ["MyName", "my.name", "123-abc"];
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. \
                 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &name_examples)
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &name_examples)
        ));
    }
    errs
}

/// Upstream `validation.IsValidLabelValue`: empty, or a qualified-name part of at most 63.
fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

// `field.Invalid(path, value string, detail).Error()`.
fn invalid_string(field: &str, value: &str, detail: &str) -> String {
    format!("{field}: Invalid value: {}: {detail}", go_quote(value))
}

// `field.Invalid(path, values []string, detail).Error()`: Go prints the slice with `%#v`.
fn invalid_list(field: &str, values: &[String], detail: &str) -> String {
    let shown = if values.is_empty() {
        // Every caller that reaches this with no values passed a nil slice upstream, except the
        // string parser's Exists path, which never has values.
        "[]string(nil)".to_owned()
    } else {
        let items: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
        format!("[]string{{{}}}", items.join(", "))
    };
    format!("{field}: Invalid value: {shown}: {detail}")
}

// `utilerrors.NewAggregate(...).Error()`: one message alone, several in brackets.
fn aggregate(mut errs: Vec<String>) -> String {
    errs.dedup();
    match errs.as_slice() {
        [one] => one.clone(),
        _ => format!("[{}]", errs.join(", ")),
    }
}

/// Go's `strconv.ParseInt(s, 10, 64)`: optional sign, decimal digits, 64-bit range.
fn parse_go_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<i64>().ok()
}

/// Go's `%q` for a string (`strconv.Quote`), used in upstream error texts.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => {
                if u32::from(c) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", u32::from(c)));
                } else {
                    out.push_str(&format!("\\U{:08x}", u32::from(c)));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ---------------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------------

/// The operator of a field selector term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `field=value` or `field==value`
    Equals,
    /// `field!=value`
    NotEquals,
}

/// One term of a field selector, with its value unescaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    /// The field, for example `spec.nodeName`.
    pub field: String,
    /// Equality or inequality.
    pub operator: FieldOperator,
    /// The value, unescaped.
    pub value: String,
}

impl FieldRequirement {
    fn matches_value(&self, actual: Option<&str>) -> bool {
        // A field the object does not have reads as the empty string, as upstream `Set.Get`.
        let actual = actual.unwrap_or("");
        match self.operator {
            FieldOperator::Equals => actual == self.value,
            FieldOperator::NotEquals => actual != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            FieldOperator::Equals => "=",
            FieldOperator::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A field selector: terms that must all hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FieldSelector {
    terms: Vec<FieldRequirement>,
}

/// Parses a field selector string as the API server does for `?fieldSelector=`.
pub fn parse_field_selector(selector: &str) -> Result<FieldSelector, SelectorError> {
    FieldSelector::parse(selector)
}

impl FieldSelector {
    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses a field selector (upstream `fields.ParseSelector`): terms are split on unescaped
    /// commas and sorted; a term with neither field nor value (`=`) selects everything and is
    /// dropped.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(selector);
        parts.sort_unstable();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, operator, raw)) = split_term(part) else {
                return Err(SelectorError::FieldTerm {
                    selector: selector.to_owned(),
                    term: part.to_owned(),
                });
            };
            let value = unescape_field_value(raw)?;
            if field.is_empty() && value.is_empty() {
                continue;
            }
            terms.push(FieldRequirement {
                field: field.to_owned(),
                operator,
                value,
            });
        }
        Ok(Self { terms })
    }

    /// A selector with one `field=value` term.
    pub fn one_term_equal(field: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            terms: vec![FieldRequirement {
                field: field.into(),
                operator: FieldOperator::Equals,
                value: value.into(),
            }],
        }
    }

    /// The terms, in parse order (sorted by their text).
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.terms
    }

    /// The fields the selector looks at, in term order (a field may repeat).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|t| t.field.as_str())
    }

    /// Whether the selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Rewrites every term with `f(field, value)` (upstream `Transform`, which the server runs
    /// with the resource's field label conversion). A term rewritten to an empty field and value
    /// is dropped; the first error is returned.
    pub fn transform<F>(self, mut f: F) -> Result<Self, SelectorError>
    where
        F: FnMut(&str, &str) -> Result<(String, String), SelectorError>,
    {
        let mut terms = Vec::with_capacity(self.terms.len());
        for t in self.terms {
            let (field, value) = f(&t.field, &t.value)?;
            if field.is_empty() && value.is_empty() {
                continue;
            }
            terms.push(FieldRequirement {
                field,
                operator: t.operator,
                value,
            });
        }
        Ok(Self { terms })
    }

    /// Rejects the first field not in `supported` with upstream's
    /// `field label not supported: <field>`.
    pub fn check_supported(&self, supported: &[&str]) -> Result<(), SelectorError> {
        match self.fields().find(|f| !supported.contains(f)) {
            Some(f) => Err(SelectorError::FieldLabelNotSupported(f.to_owned())),
            None => Ok(()),
        }
    }

    /// Whether the fields satisfy every term; a field not in the map reads as `""`.
    pub fn matches(&self, fields: &BTreeMap<String, String>) -> bool {
        self.matches_by(|f| fields.get(f).map(String::as_str))
    }

    /// Whether the fields given by `lookup` satisfy every term; `None` reads as `""`.
    pub fn matches_by<'a, F>(&self, lookup: F) -> bool
    where
        F: Fn(&str) -> Option<&'a str>,
    {
        self.terms.iter().all(|t| t.matches_value(lookup(&t.field)))
    }

    /// Whether the object satisfies every term, reading each field as a dotted path with
    /// [`field_value`].
    pub fn matches_object(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|t| t.matches_value(field_value(object, &t.field).as_deref()))
    }

    /// The value `field` must equal, if an `=` term pins it.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && t.operator == FieldOperator::Equals)
            .map(|t| t.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The string form of the value at a dotted path (`spec.nodeName`, `status.phase`), as field
/// selectors compare it: strings as they are, booleans and numbers printed, anything else (or a
/// missing field) `None`. The server decides which fields a resource offers and their defaults.
pub fn field_value(object: &Value, path: &str) -> Option<String> {
    let mut cur = object;
    for seg in path.split('.') {
        cur = cur.as_object()?.get(seg)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Escapes `\`, `,` and `=` in a field selector value (upstream `fields.EscapeValue`).
pub fn escape_field_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Undoes [`escape_field_value`], rejecting unknown escapes and unescaped `,` or `=`.
pub fn unescape_field_value(s: &str) -> Result<String, SelectorError> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_owned());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                other => return Err(SelectorError::InvalidEscape(format!("\\{other}"))),
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => return Err(SelectorError::UnescapedCharacter(c)),
            other => out.push(other),
        }
    }
    if in_slash {
        return Err(SelectorError::InvalidEscape("\\".to_owned()));
    }
    Ok(out)
}

// Splits on commas not preceded by an escaping backslash; an empty selector has no terms.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(selector.get(start..i).unwrap_or_default());
            start = i + 1;
        }
    }
    terms.push(selector.get(start..).unwrap_or_default());
    terms
}

// The first operator found scanning left to right; at one position `!=` beats `==` beats `=`.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = term.get(i..)?;
        for (op, kind) in [
            ("!=", FieldOperator::NotEquals),
            ("==", FieldOperator::Equals),
            ("=", FieldOperator::Equals),
        ] {
            if let Some(rhs) = rest.strip_prefix(op) {
                return Some((term.get(..i)?, kind, rhs));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;
    use serde_json::json;

    // (selector, labels or fields, expected match)
    type MatchCase<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
    type SplitCase<'a> = (&'a str, Option<(&'a str, FieldOperator, &'a str)>);

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement::new(key, op, values.iter().map(|v| (*v).to_owned()).collect()).unwrap()
    }

    fn sel(reqs: Vec<Requirement>) -> LabelSelector {
        LabelSelector::from_requirements(reqs)
    }

    // Upstream TestSelectorParse: good strings print back without spaces.
    #[test]
    fn label_parse_good_strings_round_trip() {
        for s in [
            "x=a,y=b,z=c",
            "",
            "x!=a,y=b",
            "x=",
            "x= ",
            "x=,z= ",
            "x= ,z= ",
            "!x",
            "x>1",
            "x>1,z<5",
        ] {
            let parsed = parse_label_selector(s).unwrap();
            assert_eq!(parsed.to_string(), s.replace(' ', ""), "{s}");
        }
    }

    #[test]
    fn label_parse_bad_strings() {
        for s in ["x=a||y=b", "x==a==b", "!x=a", "x<a"] {
            assert!(parse_label_selector(s).is_err(), "{s}");
        }
    }

    #[test]
    fn label_parse_is_deterministic() {
        let a = parse_label_selector("x=a,a=x").unwrap();
        let b = parse_label_selector("a=x,x=a").unwrap();
        assert_eq!(a.to_string(), b.to_string());
        assert_eq!(a.to_string(), "a=x,x=a");
    }

    // Upstream TestSelectorMatches.
    #[test]
    fn label_matches_table() {
        let cases: &[MatchCase<'_>] = &[
            ("", &[("x", "y")], true),
            ("x=y", &[("x", "y")], true),
            ("x=y,z=w", &[("x", "y"), ("z", "w")], true),
            ("x!=y,z!=w", &[("x", "z"), ("z", "a")], true),
            ("notin=in", &[("notin", "in")], true),
            ("x", &[("x", "z")], true),
            ("!x", &[("y", "z")], true),
            ("x>1", &[("x", "2")], true),
            ("x<1", &[("x", "0")], true),
            ("x=z", &[], false),
            ("x=y", &[("x", "z")], false),
            ("x=y,z=w", &[("x", "w"), ("z", "w")], false),
            ("x!=y,z!=w", &[("x", "z"), ("z", "w")], false),
            ("x", &[("y", "z")], false),
            ("!x", &[("x", "z")], false),
            ("x>1", &[("x", "0")], false),
            ("x<1", &[("x", "2")], false),
            ("foo=bar", &[("foo", "bar"), ("baz", "blah")], true),
            ("foo=bar,baz=blah", &[("foo", "bar"), ("baz", "blah")], true),
            ("foo=blah", &[("foo", "bar"), ("baz", "blah")], false),
            (
                "foo=bar,foobar=bar,baz=blah",
                &[("foo", "bar"), ("baz", "blah")],
                false,
            ),
            ("x in (a,b)", &[("x", "b")], true),
            ("x in (a,b)", &[("x", "c")], false),
            ("x in (a,b)", &[], false),
            ("x notin (a,b)", &[], true),
            ("x notin (a,b)", &[("x", "a")], false),
            ("x in ()", &[("x", "")], true),
            ("x in ()", &[("x", "a")], false),
            ("x>1", &[("x", "v2")], false),
            ("x<2", &[("x", "-1")], true),
            ("x>1", &[("x", "+2")], true),
            ("x==y", &[("x", "y")], true),
        ];
        for (s, labels, want) in cases {
            let selector = parse_label_selector(s).unwrap();
            assert_eq!(selector.matches(&set(labels)), *want, "{s} on {labels:?}");
        }
    }

    // Upstream TestSetSelectorParser (valid inputs and their parsed form).
    #[test]
    fn label_parse_set_based() {
        use Operator::*;
        let cases: Vec<(&str, LabelSelector)> = vec![
            ("", LabelSelector::everything()),
            ("\rx", sel(vec![req("x", Exists, &[])])),
            (
                "this-is-a-dns.domain.com/key-with-dash",
                sel(vec![req(
                    "this-is-a-dns.domain.com/key-with-dash",
                    Exists,
                    &[],
                )]),
            ),
            (
                "this-is-another-dns.domain.com/key-with-dash in (so,what)",
                sel(vec![req(
                    "this-is-another-dns.domain.com/key-with-dash",
                    In,
                    &["so", "what"],
                )]),
            ),
            (
                "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
                sel(vec![req(
                    "0.1.2.domain/99",
                    NotIn,
                    &["10.10.100.1", "tick.tack.clock"],
                )]),
            ),
            ("foo  in\t (abc)", sel(vec![req("foo", In, &["abc"])])),
            ("x notin\n (abc)", sel(vec![req("x", NotIn, &["abc"])])),
            (
                "x  notin\t\t\t(abc,def)",
                sel(vec![req("x", NotIn, &["abc", "def"])]),
            ),
            ("x in (abc,def)", sel(vec![req("x", In, &["abc", "def"])])),
            ("x in (abc,)", sel(vec![req("x", In, &["", "abc"])])),
            ("x in ()", sel(vec![req("x", In, &[""])])),
            (
                "x notin (abc,,def),bar,z in (),w",
                sel(vec![
                    req("bar", Exists, &[]),
                    req("w", Exists, &[]),
                    req("x", NotIn, &["", "abc", "def"]),
                    req("z", In, &[""]),
                ]),
            ),
            ("x=a", sel(vec![req("x", Equals, &["a"])])),
            ("x>1", sel(vec![req("x", GreaterThan, &["1"])])),
            ("x<7", sel(vec![req("x", LessThan, &["7"])])),
            (
                "x=a,y!=b",
                sel(vec![req("x", Equals, &["a"]), req("y", NotEquals, &["b"])]),
            ),
            (
                "x=a,y!=b,z in (h,i,j)",
                sel(vec![
                    req("x", Equals, &["a"]),
                    req("y", NotEquals, &["b"]),
                    req("z", In, &["h", "i", "j"]),
                ]),
            ),
            ("x notin ( )", sel(vec![req("x", NotIn, &[""])])),
            ("x notin (, a)", sel(vec![req("x", NotIn, &["", "a"])])),
            ("a ", sel(vec![req("a", Exists, &[])])),
            (
                "a in (x,y,notin, z,in)",
                sel(vec![req("a", In, &["in", "notin", "x", "y", "z"])]),
            ),
            ("in in (in)", sel(vec![req("in", In, &["in"])])),
            ("x in (a,a,b)", sel(vec![req("x", In, &["a", "b"])])),
        ];
        for (s, want) in cases {
            assert_eq!(parse_label_selector(s).unwrap(), want, "{s:?}");
        }
    }

    #[test]
    fn label_parse_errors_have_upstream_text() {
        let qn = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        let lv = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
        let cases: Vec<(&str, String)> =
            vec![
            ("x,,y", "found ',', expected: identifier after ','".to_owned()),
            (",x,y", "found ',', expected: !, identifier, or 'end of string'".to_owned()),
            (
                "x nott in (y)",
                "unable to parse requirement: found 'nott', expected: in, notin, =, ==, !=, gt, lt"
                    .to_owned(),
            ),
            ("a in (xyz),", "found '', expected: identifier after ','".to_owned()),
            ("a in (xyz)b notin ()", "found 'b', expected: ',' or 'end of string'".to_owned()),
            (
                "a in (xyz abc)",
                "unable to parse requirement: found 'abc', expected: ',' or ')'".to_owned(),
            ),
            (
                "a notin(",
                "unable to parse requirement: found '', expected: ',', ')' or identifier"
                    .to_owned(),
            ),
            (
                "a (",
                "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"
                    .to_owned(),
            ),
            ("(", "found '(', expected: !, identifier, or 'end of string'".to_owned()),
            ("!x=a", "found '=', expected: ',' or 'end of string'".to_owned()),
            ("x==a==b", "found '==', expected: ',' or 'end of string'".to_owned()),
            ("a in x", "unable to parse requirement: found 'x' expected: '('".to_owned()),
            ("a=(", "unable to parse requirement: found '(', expected: identifier".to_owned()),
            ("!", "unable to parse requirement: found '', expected: identifier".to_owned()),
            ("a !", "unable to parse requirement: found '!', expected: in, notin, =, ==, !=, gt, lt"
                .to_owned()),
            (
                "x in (a,,)",
                "unable to parse requirement: found ')', expected: ',', or identifier".to_owned(),
            ),
            (
                "x<a",
                "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer"
                    .to_owned(),
            ),
            ("a@b=c", format!("unable to parse requirement: <nil>: Invalid value: \"a@b\": {qn}")),
            (
                "x=a||y",
                format!("unable to parse requirement: values[0][x]: Invalid value: \"a||y\": {lv}"),
            ),
            (
                "/a",
                "unable to parse requirement: <nil>: Invalid value: \"/a\": prefix part must be non-empty"
                    .to_owned(),
            ),
            (
                "a/",
                format!(
                    "unable to parse requirement: <nil>: Invalid value: \"a/\": name part must be non-empty; {qn}"
                ),
            ),
            (
                "Example.com/a",
                "unable to parse requirement: <nil>: Invalid value: \"Example.com/a\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                    .to_owned(),
            ),
            (
                "a/b/c",
                "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
                    .to_owned(),
            ),
        ];
        for (s, want) in cases {
            let err = parse_label_selector(s).unwrap_err();
            assert_eq!(err.to_string(), want, "{s:?}");
        }
        let long = "a".repeat(64);
        let err = parse_label_selector(&long).unwrap_err().to_string();
        assert!(
            err.contains("name part must be no more than 63 characters"),
            "{err}"
        );
        let err = parse_label_selector(&format!("a={long}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(": must be no more than 63 characters"),
            "{err}"
        );
        let err = parse_label_selector(&format!("a=-{long}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(": must be no more than 63 characters; a valid label"),
            "{err}"
        );
    }

    #[test]
    fn label_nul_byte_ends_a_token_like_upstream() {
        // Upstream reads a NUL as end-of-input inside a token, then resumes after it.
        let err = parse_label_selector("a\0b").unwrap_err().to_string();
        assert_eq!(
            err,
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(
            parse_label_selector(" \0x").unwrap(),
            LabelSelector::everything()
        );
    }

    // Upstream TestRequirementConstructor.
    #[test]
    fn requirement_constructor() {
        use Operator::*;
        let ok: &[(&str, Operator, &[&str])] = &[
            ("x3", In, &["foo"]),
            ("x4", NotIn, &["foo"]),
            ("x6", Exists, &[]),
            ("x7", DoesNotExist, &[]),
            ("x11", GreaterThan, &["1"]),
            ("x12", LessThan, &["6"]),
        ];
        for (k, op, vals) in ok {
            assert!(
                Requirement::new(*k, *op, vals.iter().map(|v| (*v).to_owned()).collect()).is_ok()
            );
        }
        let bad: &[(&str, Operator, &[&str], &str)] = &[
            (
                "x1",
                In,
                &[],
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                "x5",
                Equals,
                &["bar", "foo"],
                "values: Invalid value: []string{\"bar\", \"foo\"}: exact-match compatibility requires one single value",
            ),
            (
                "x8",
                Exists,
                &["foo"],
                "values: Invalid value: []string{\"foo\"}: values set must be empty for exists and does not exist",
            ),
            (
                "x13",
                GreaterThan,
                &[],
                "values: Invalid value: []string(nil): for 'Gt', 'Lt' operators, exactly one value is required",
            ),
            (
                "x14",
                GreaterThan,
                &["bar"],
                "values[0]: Invalid value: \"bar\": for 'Gt', 'Lt' operators, the value must be an integer",
            ),
            (
                "x17",
                Equals,
                &["a b"],
                "values[0][x17]: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            ),
        ];
        for (k, op, vals, want) in bad {
            let err = Requirement::new(*k, *op, vals.iter().map(|v| (*v).to_owned()).collect())
                .unwrap_err();
            assert_eq!(err.to_string(), *want, "{k}");
        }
        // Several errors aggregate in brackets.
        let err = Requirement::new("a b", Exists, vec!["x".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("[key: Invalid value: \"a b\": name part"),
            "{err}"
        );
        assert!(
            err.contains(", values: Invalid value: []string{\"x\"}"),
            "{err}"
        );
        let key = "a".repeat(254);
        let err = Requirement::new(key, Exists, vec![])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("key: Invalid value: \"aaa"), "{err}");
    }

    // Upstream TestToString.
    #[test]
    fn label_to_string() {
        use Operator::*;
        let cases = vec![
            (
                sel(vec![
                    req("x", In, &["abc", "def"]),
                    req("y", NotIn, &["jkl"]),
                    req("z", Exists, &[]),
                ]),
                "x in (abc,def),y notin (jkl),z",
            ),
            (
                sel(vec![
                    req("x", NotIn, &["abc", "def"]),
                    req("y", NotEquals, &["jkl"]),
                    req("z", DoesNotExist, &[]),
                ]),
                "x notin (abc,def),y!=jkl,!z",
            ),
            (
                sel(vec![
                    req("x", NotIn, &["abc"]),
                    req("y", In, &["jkl", "mno"]),
                    req("z", NotIn, &[""]),
                ]),
                "x notin (abc),y in (jkl,mno),z notin ()",
            ),
            (
                sel(vec![
                    req("x", Equals, &["abc"]),
                    req("y", DoubleEquals, &["jkl"]),
                    req("z", NotEquals, &["a"]),
                    req("z", Exists, &[]),
                ]),
                "x=abc,y==jkl,z!=a,z",
            ),
            (
                sel(vec![
                    req("x", GreaterThan, &["2"]),
                    req("y", LessThan, &["8"]),
                    req("z", Exists, &[]),
                ]),
                "x>2,y<8,z",
            ),
            (sel(vec![req("x", In, &["b", "a"])]), "x in (a,b)"),
        ];
        for (s, want) in cases {
            assert_eq!(s.to_string(), want);
        }
    }

    // Upstream TestRequirementSelectorMatching.
    #[test]
    fn requirement_matching() {
        use Operator::*;
        let cases = vec![
            (
                set(&[("x", "foo"), ("y", "baz")]),
                sel(vec![req("x", In, &["foo"]), req("y", NotIn, &["alpha"])]),
                true,
            ),
            (
                set(&[("x", "foo"), ("y", "baz")]),
                sel(vec![req("x", In, &["foo"]), req("y", In, &["alpha"])]),
                false,
            ),
            (
                set(&[("y", "")]),
                sel(vec![req("x", NotIn, &[""]), req("y", Exists, &[])]),
                true,
            ),
            (
                set(&[("y", "")]),
                sel(vec![req("x", DoesNotExist, &[]), req("y", Exists, &[])]),
                true,
            ),
            (
                set(&[("y", "")]),
                sel(vec![req("x", NotIn, &[""]), req("y", DoesNotExist, &[])]),
                false,
            ),
            (set(&[("y", "baz")]), sel(vec![req("x", In, &[""])]), false),
            (
                set(&[("z", "2")]),
                sel(vec![req("z", GreaterThan, &["1"])]),
                true,
            ),
            (
                set(&[("z", "v2")]),
                sel(vec![req("z", GreaterThan, &["1"])]),
                false,
            ),
        ];
        for (labels, s, want) in cases {
            assert_eq!(s.matches(&labels), want, "{s} on {labels:?}");
        }
    }

    #[test]
    fn label_matches_json_labels() {
        let s = parse_label_selector("app=web,tier notin (db)").unwrap();
        assert!(s.matches(&json!({"app": "web"})));
        assert!(!s.matches(&json!({"app": "web", "tier": "db"})));
        assert!(!s.matches(&Value::Null));
        assert!(parse_label_selector("!app").unwrap().matches(&Value::Null));
        assert!(s.matches_object(&json!({"metadata": {"labels": {"app": "web"}}})));
        assert!(!s.matches_object(&json!({"metadata": {}})));
        assert!(LabelSelector::everything().matches_object(&json!({})));
        let labels = json!({"app": "web"});
        let map = labels.as_object().unwrap();
        assert!(s.matches(map));
        let hm: HashMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        assert!(s.matches(&hm));
    }

    #[test]
    fn label_selector_from_json() {
        let s = LabelSelector::from_label_selector(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["fe", "be"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "zone", "operator": "Exists"}
            ]
        }))
        .unwrap();
        assert_eq!(
            s.to_string(),
            "app=web,!canary,env notin (dev),tier in (be,fe),zone"
        );
        assert!(s.matches(&set(&[("app", "web"), ("tier", "fe"), ("zone", "a")])));
        assert!(!s.matches(&set(&[("app", "web"), ("tier", "fe")])));
        assert!(!s.matches(&set(&[
            ("app", "web"),
            ("tier", "fe"),
            ("zone", "a"),
            ("canary", "1")
        ])));

        let nothing = LabelSelector::from_label_selector(&Value::Null).unwrap();
        assert!(nothing.matches_nothing());
        assert!(!nothing.matches(&set(&[])));
        let everything = LabelSelector::from_label_selector(&json!({})).unwrap();
        assert!(everything.is_empty());
        assert!(everything.matches(&set(&[("a", "b")])));
        let everything =
            LabelSelector::from_label_selector(&json!({"matchLabels": {}, "matchExpressions": []}))
                .unwrap();
        assert!(everything.is_empty());
    }

    #[test]
    fn label_selector_from_json_errors() {
        let cases = vec![
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "\"Gt\" is not a valid label selector operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "in", "values": ["1"]}]}),
                "\"in\" is not a valid label selector operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "values: Invalid value: []string{\"x\"}: values set must be empty for exists and does not exist",
            ),
            (
                json!({"matchLabels": {"a": "b c"}}),
                "values[0][a]: Invalid value: \"b c\": a valid label",
            ),
            (
                json!({"matchLabels": {"a/b/c": "x"}}),
                "key: Invalid value: \"a/b/c\": a qualified name",
            ),
            (
                json!({"matchLabels": {"a": 1}}),
                "invalid label selector: matchLabels[a] must be a string, got number",
            ),
            (
                json!([1]),
                "invalid label selector: expected an object, got array",
            ),
        ];
        for (doc, want) in cases {
            let err = LabelSelector::from_label_selector(&doc)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(want), "{doc}: {err}");
        }
    }

    #[test]
    fn label_from_set_and_exact_match() {
        let m = set(&[("app", "web"), ("tier", "fe")]);
        let s = LabelSelector::from_set(&m);
        assert_eq!(s.to_string(), "app=web,tier=fe");
        assert!(s.matches(&m));
        assert!(LabelSelector::from_set(&set(&[])).matches(&m));
        assert_eq!(s.requires_exact_match("app"), Some("web"));
        let s = parse_label_selector("a in (x),b in (x,y),c!=z").unwrap();
        assert_eq!(s.requires_exact_match("a"), Some("x"));
        assert_eq!(s.requires_exact_match("b"), None);
        assert_eq!(s.requires_exact_match("c"), None);
        assert_eq!(s.requires_exact_match("d"), None);
    }

    #[test]
    fn go_quote_escapes_like_go() {
        assert_eq!(
            go_quote("a\"b\\c\n\t\u{1}\u{7f}é"),
            "\"a\\\"b\\\\c\\n\\t\\x01\\x7fé\""
        );
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
    }

    // Upstream fields TestSplitTerms / TestSplitTerm / TestEscapeValue.
    #[test]
    fn field_split_terms() {
        let cases: &[(&str, &[&str])] = &[
            ("a", &["a"]),
            ("a=avalue", &["a=avalue"]),
            ("a=avalue,b=bvalue", &["a=avalue", "b=bvalue"]),
            (
                "a=avalue,b==bvalue,c!=cvalue",
                &["a=avalue", "b==bvalue", "c!=cvalue"],
            ),
            ("", &[]),
            ("a=a,", &["a=a", ""]),
            (",a=a", &["", "a=a"]),
            (r"k=\,,k2=v2", &[r"k=\,", "k2=v2"]),
            (r"k=\\,k2=v2", &[r"k=\\", "k2=v2"]),
            (r"k=\\\,,k2=v2", &[r"k=\\\,", "k2=v2"]),
            (r"k=\a\b\", &[r"k=\a\b\"]),
            (r"k=\", &[r"k=\"]),
            ("함=수,목=록", &["함=수", "목=록"]),
        ];
        for (s, want) in cases {
            assert_eq!(split_terms(s), want.to_vec(), "{s}");
        }
        use FieldOperator::*;
        let terms: &[SplitCase<'_>] = &[
            ("a=value", Some(("a", Equals, "value"))),
            ("b==value", Some(("b", Equals, "value"))),
            ("c!=value", Some(("c", NotEquals, "value"))),
            ("", None),
            ("a", None),
            (r"k=\,", Some(("k", Equals, r"\,"))),
            (r"k=\=", Some(("k", Equals, r"\="))),
            (r"k=\\\a\b\=\,\", Some(("k", Equals, r"\\\a\b\=\,\"))),
            ("함=수", Some(("함", Equals, "수"))),
        ];
        for (t, want) in terms {
            assert_eq!(split_term(t), *want, "{t}");
        }
    }

    #[test]
    fn field_escape_round_trip() {
        for (raw, escaped) in [
            ("", ""),
            ("a", "a"),
            ("=", r"\="),
            (",", r"\,"),
            (r"\", r"\\"),
            (r"\=\,\", r"\\\=\\\,\\"),
        ] {
            assert_eq!(escape_field_value(raw), escaped);
            assert_eq!(unescape_field_value(escaped).unwrap(), raw);
        }
        for bad in [r"\", r"\\\", r"\a"] {
            assert!(
                matches!(
                    unescape_field_value(bad),
                    Err(SelectorError::InvalidEscape(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn field_parse_good_and_bad() {
        for s in ["x=a,y=b,z=c", "", "x!=a,y=b", r"x=a||y\=b", r"x=a\=\=b"] {
            assert_eq!(parse_field_selector(s).unwrap().to_string(), s, "{s}");
        }
        for s in [
            "x=a||y=b",
            "x==a==b",
            "x=a,b",
            "x in (a)",
            "x in (a,b,c)",
            "x",
        ] {
            assert!(parse_field_selector(s).is_err(), "{s}");
        }
        let a = parse_field_selector("x=a,a=x").unwrap();
        let b = parse_field_selector("a=x,x=a").unwrap();
        assert_eq!(a.to_string(), b.to_string());
        // `==` prints as `=`; `=` alone selects everything.
        assert_eq!(parse_field_selector("a==b").unwrap().to_string(), "a=b");
        assert!(parse_field_selector("=").unwrap().is_empty());
        assert!(parse_field_selector(",,").unwrap().is_empty());
        assert!(!parse_field_selector("=x").unwrap().is_empty());
    }

    #[test]
    fn field_parse_error_texts() {
        let cases = [
            ("x=a,b", "invalid selector: 'x=a,b'; can't understand 'b'"),
            (
                "x in (a)",
                "invalid selector: 'x in (a)'; can't understand 'x in (a)'",
            ),
            (
                "x=a=b",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                "x==a==b",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                r"x=\a",
                r"invalid field selector: invalid escape sequence: \a",
            ),
            (
                r"x=a\",
                r"invalid field selector: invalid escape sequence: \",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(
                parse_field_selector(s).unwrap_err().to_string(),
                want,
                "{s}"
            );
        }
    }

    // Upstream fields TestSelectorMatches.
    #[test]
    fn field_matches() {
        let cases: &[MatchCase<'_>] = &[
            ("", &[("x", "y")], true),
            ("x=y", &[("x", "y")], true),
            ("x=y,z=w", &[("x", "y"), ("z", "w")], true),
            ("x!=y,z!=w", &[("x", "z"), ("z", "a")], true),
            ("notin=in", &[("notin", "in")], true),
            ("x=y", &[("x", "z")], false),
            ("x=y,z=w", &[("x", "w"), ("z", "w")], false),
            ("x!=y,z!=w", &[("x", "z"), ("z", "w")], false),
            ("foo=bar,baz=blah", &[("foo", "bar"), ("baz", "blah")], true),
            (r"complex=\=value\\\,\\", &[("complex", r"=value\,\")], true),
            (
                "foo=bar,foobar=bar,baz=blah",
                &[("foo", "bar"), ("baz", "blah")],
                false,
            ),
            ("spec.nodeName=", &[], true),
            ("spec.nodeName!=", &[], false),
            ("spec.nodeName!=", &[("spec.nodeName", "n1")], true),
        ];
        for (s, fields, want) in cases {
            let selector = parse_field_selector(s).unwrap();
            assert_eq!(selector.matches(&set(fields)), *want, "{s}");
        }
    }

    #[test]
    fn field_selector_on_objects() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "hostNetwork": true},
            "status": {"phase": "Running"}
        });
        assert_eq!(field_value(&pod, "spec.nodeName").as_deref(), Some("n1"));
        assert_eq!(
            field_value(&pod, "spec.hostNetwork").as_deref(),
            Some("true")
        );
        assert_eq!(field_value(&pod, "spec.missing"), None);
        assert_eq!(field_value(&pod, "spec"), None);
        let s = parse_field_selector("spec.nodeName=n1,status.phase!=Failed").unwrap();
        assert!(s.matches_object(&pod));
        let s = parse_field_selector("metadata.name=q").unwrap();
        assert!(!s.matches_object(&pod));
        let s = parse_field_selector("spec.nodeName=").unwrap();
        assert!(s.matches_object(&json!({"spec": {}})));
        assert_eq!(
            parse_field_selector("spec.nodeName=n1")
                .unwrap()
                .requires_exact_match("spec.nodeName"),
            Some("n1")
        );
        assert_eq!(
            parse_field_selector("spec.nodeName!=n1")
                .unwrap()
                .requires_exact_match("spec.nodeName"),
            None
        );
    }

    #[test]
    fn field_supported_and_transform() {
        let s = parse_field_selector("spec.nodeName=n1,foo=bar").unwrap();
        assert_eq!(s.fields().collect::<Vec<_>>(), vec!["foo", "spec.nodeName"]);
        let err = s
            .check_supported(&["spec.nodeName", "metadata.name"])
            .unwrap_err();
        assert_eq!(err.to_string(), "field label not supported: foo");
        assert!(s.check_supported(&["spec.nodeName", "foo"]).is_ok());
        // Upstream TestTransform.
        let t = parse_field_selector("a=b,c=d")
            .unwrap()
            .transform(|f, v| {
                Ok(if f == "a" {
                    ("e".into(), "f".into())
                } else {
                    (f.into(), v.into())
                })
            })
            .unwrap();
        assert_eq!(t.to_string(), "e=f,c=d");
        let t = parse_field_selector("a=b,c=d,e=f")
            .unwrap()
            .transform(|f, v| {
                Ok(if f == "c" {
                    (String::new(), String::new())
                } else {
                    (f.into(), v.into())
                })
            })
            .unwrap();
        assert_eq!(t.to_string(), "a=b,e=f");
        let t = parse_field_selector("a=b")
            .unwrap()
            .transform(|_, _| Ok((String::new(), String::new())))
            .unwrap();
        assert!(t.is_empty());
        let err = parse_field_selector("a=b")
            .unwrap()
            .transform(|f, _| Err(SelectorError::FieldLabelNotSupported(f.into())))
            .unwrap_err();
        assert_eq!(err.to_string(), "field label not supported: a");
        assert_eq!(
            FieldSelector::one_term_equal("x", "a,b").to_string(),
            r"x=a\,b"
        );
    }

    proptest! {
        #[test]
        fn label_parse_never_panics(s in ".{0,40}") {
            let _ = parse_label_selector(&s);
        }

        #[test]
        fn label_parse_never_panics_on_selector_alphabet(s in "[a-z0-9 ,=!()<>/._-]{0,30}") {
            let _ = parse_label_selector(&s);
        }

        #[test]
        fn field_parse_never_panics(s in ".{0,40}") {
            let _ = parse_field_selector(&s);
        }

        #[test]
        fn label_display_round_trips(s in "[a-z0-9 ,=!()<>/._-]{0,30}") {
            if let Ok(parsed) = parse_label_selector(&s) {
                let printed = parsed.to_string();
                let reparsed = parse_label_selector(&printed);
                prop_assert_eq!(reparsed.as_ref(), Ok(&parsed), "printed as {}", printed);
            }
        }

        #[test]
        fn label_display_round_trips_generated(
            reqs in proptest::collection::vec(
                ("[a-z]([a-z0-9.-]{0,6}[a-z0-9])?", 0usize..9, proptest::collection::vec("[A-Za-z0-9]{0,4}", 0..3)),
                0..5,
            )
        ) {
            let ops = [Operator::Equals, Operator::DoubleEquals, Operator::NotEquals, Operator::In,
                Operator::NotIn, Operator::Exists, Operator::DoesNotExist, Operator::GreaterThan,
                Operator::LessThan];
            let mut built = Vec::new();
            for (key, op, values) in reqs {
                let op = ops[op % ops.len()];
                let mut values: Vec<String> = match op {
                    Operator::Exists | Operator::DoesNotExist => vec![],
                    Operator::In | Operator::NotIn if !values.is_empty() => values,
                    Operator::GreaterThan | Operator::LessThan => vec![values.len().to_string()],
                    _ => vec![values.into_iter().next().unwrap_or_default()],
                };
                values.sort();
                values.dedup();
                if let Ok(r) = Requirement::new(key, op, values) {
                    built.push(r);
                }
            }
            let s = LabelSelector::from_requirements(built);
            prop_assert_eq!(parse_label_selector(&s.to_string()), Ok(s.clone()), "printed as {}", s);
        }

        #[test]
        fn field_display_round_trips(s in r"[a-z.=!,\\]{0,24}", probe in "[a-z.]{0,3}") {
            if let Ok(parsed) = parse_field_selector(&s) {
                // Printing normalises `==` to `=`, which can reorder terms once; after that the
                // text is a fixed point, and the meaning never changes.
                let printed = parsed.to_string();
                let reparsed = parse_field_selector(&printed).unwrap();
                let again = parse_field_selector(&reparsed.to_string()).unwrap();
                prop_assert_eq!(again.to_string(), reparsed.to_string());
                let mut a = parsed.requirements().to_vec();
                let mut b = reparsed.requirements().to_vec();
                a.sort_by(|x, y| (&x.field, &x.value).cmp(&(&y.field, &y.value)));
                b.sort_by(|x, y| (&x.field, &x.value).cmp(&(&y.field, &y.value)));
                prop_assert_eq!(a, b);
                let fields: BTreeMap<String, String> = [("a".to_owned(), probe)].into();
                prop_assert_eq!(reparsed.matches(&fields), parsed.matches(&fields));
            }
        }

        #[test]
        fn field_escape_round_trips(v in ".{0,20}") {
            prop_assert_eq!(unescape_field_value(&escape_field_value(&v)), Ok(v));
        }
    }
}
