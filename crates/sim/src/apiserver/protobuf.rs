//! Decoding of `application/vnd.kubernetes.protobuf` request bodies.
//!
//! The body is the magic `k8s\0` and a `runtime.Unknown` envelope whose `raw` bytes are the
//! typed object in the proto2 encoding of Kubernetes' `generated.proto` files. The server keeps
//! objects as JSON, so the object is decoded into exactly the JSON the client would have sent had
//! it spoken JSON: Go JSON names, special types as their JSON scalars (Quantity, Time, IntOrString
//! ...), and zero values of Go's non-pointer `omitempty` fields left out (Go's protobuf encoder
//! always writes those; its JSON encoder drops them). The field table is generated, see
//! `proto_schema.rs`.
//!
//! The wire reader is bounds-checked and never trusts a length; nesting is capped at
//! [`MAX_DEPTH`]; the JSON produced is at most a small constant times the body's size.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value};

use super::proto_schema::{MESSAGES, ROOTS};

/// The prefix of every Kubernetes protobuf body.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// How deep messages may nest (a Pod needs about 10).
pub const MAX_DEPTH: usize = 100;

const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";
const TYPE_META: &str = "k8s.io.apimachinery.pkg.runtime.TypeMeta";
const DELETE_OPTIONS: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions";

/// A protobuf body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("the body does not start with the Kubernetes protobuf prefix \"k8s\\x00\"")]
    BadMagic,
    /// The envelope names no kind or no apiVersion.
    #[error("the protobuf envelope (runtime.Unknown) has no {0}")]
    MissingTypeMeta(&'static str),
    /// No schema for the kind.
    #[error("no protobuf schema for kind {kind:?} in apiVersion {api_version:?}")]
    UnknownKind {
        /// The envelope's apiVersion.
        api_version: String,
        /// The envelope's kind.
        kind: String,
    },
    /// The bytes are not valid protobuf.
    #[error("malformed protobuf in {message}, {field}: {problem}")]
    Malformed {
        /// The proto message being read.
        message: &'static str,
        /// The field being read (its JSON name and number), or where in the message.
        field: String,
        /// What was wrong.
        #[source]
        problem: WireProblem,
    },
    /// Valid protobuf whose value has no JSON form.
    #[error("invalid value in {message}, {field}: {problem}")]
    InvalidValue {
        /// The proto message being read.
        message: &'static str,
        /// The field.
        field: String,
        /// What was wrong.
        problem: String,
    },
    /// Messages nest deeper than [`MAX_DEPTH`].
    #[error("protobuf messages nest deeper than {MAX_DEPTH} levels at {message}, {field}")]
    TooDeep {
        /// The message at the limit.
        message: &'static str,
        /// The field that would go deeper.
        field: String,
    },
}

/// What is wrong with the protobuf wire format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireProblem {
    /// The input ends inside a varint.
    #[error("the input ends inside a varint")]
    TruncatedVarint,
    /// A varint of more than 64 bits.
    #[error("a varint longer than 64 bits")]
    OverlongVarint,
    /// The input ends inside a fixed-size value.
    #[error("the input ends inside a {0}-byte value")]
    TruncatedFixed(usize),
    /// A length-delimited value longer than what is left.
    #[error("a length of {len} bytes runs past the end ({remaining} bytes left)")]
    LengthPastEnd {
        /// The declared length.
        len: u64,
        /// The bytes left.
        remaining: usize,
    },
    /// A wire type the field's type cannot have.
    #[error("wire type {got}, but the field needs {expected}")]
    WrongWireType {
        /// The wire type found.
        got: u8,
        /// What the field needs.
        expected: &'static str,
    },
    /// Wire types 6 and 7 do not exist.
    #[error("invalid wire type {0}")]
    InvalidWireType(u8),
    /// Groups (wire types 3 and 4) are not used by Kubernetes.
    #[error("groups (wire types 3 and 4) are not supported")]
    Group,
    /// Field numbers start at 1 and end at 2^29 - 1.
    #[error("invalid field number {0}")]
    InvalidFieldNumber(u64),
}

// ---------------------------------------------------------------------------------------------
// The schema types the generated table is made of.

/// The type of a field's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `string`.
    Str,
    /// `bool`.
    Bool,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `bytes`, base64 in JSON.
    Bytes,
    /// `resource.Quantity`: a JSON string.
    Quantity,
    /// `meta.v1.Time`: RFC 3339, whole seconds, or `null`.
    Time,
    /// `intstr.IntOrString`: a JSON number or string.
    IntOrString,
    /// `meta.v1.FieldsV1`: the embedded JSON.
    FieldsV1,
    /// A Go named `[]string` (`ExtraValue`, `Verbs`): `repeated string items = 1`, a JSON array.
    StrList,
    /// A message, by full name.
    Msg(&'static str),
    /// A `map<string, V>`: a JSON object.
    Map(&'static Kind),
}

/// How a field's presence on the wire maps to JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    /// In the JSON whenever on the wire.
    Wire,
    /// A Go non-pointer `omitempty` scalar: left out when zero.
    ZeroOmitted,
    /// `repeated`: a JSON array.
    Repeated,
    /// A Go `json:",inline"` embedded message: its fields are the parent's.
    Inline,
}

/// One field of a message.
#[derive(Debug)]
pub(crate) struct Field {
    tag: u32,
    json: &'static str,
    kind: Kind,
    presence: Presence,
}

impl Field {
    /// A singular field, in the JSON when on the wire.
    pub(crate) const fn one(tag: u32, json: &'static str, kind: Kind) -> Self {
        Self {
            tag,
            json,
            kind,
            presence: Presence::Wire,
        }
    }

    /// A singular scalar left out of the JSON when zero.
    pub(crate) const fn omit0(tag: u32, json: &'static str, kind: Kind) -> Self {
        Self {
            tag,
            json,
            kind,
            presence: Presence::ZeroOmitted,
        }
    }

    /// A repeated field.
    pub(crate) const fn rep(tag: u32, json: &'static str, kind: Kind) -> Self {
        Self {
            tag,
            json,
            kind,
            presence: Presence::Repeated,
        }
    }

    /// An inlined message.
    pub(crate) const fn inline(tag: u32, kind: Kind) -> Self {
        Self {
            tag,
            json: "",
            kind,
            presence: Presence::Inline,
        }
    }
}

/// One message: its full proto name and fields, sorted by tag.
#[derive(Debug)]
pub(crate) struct Message {
    name: &'static str,
    fields: &'static [Field],
}

impl Message {
    pub(crate) const fn new(name: &'static str, fields: &'static [Field]) -> Self {
        Self { name, fields }
    }

    fn field(&self, tag: u32) -> Option<&'static Field> {
        self.fields
            .binary_search_by_key(&tag, |f| f.tag)
            .ok()
            .and_then(|i| self.fields.get(i))
    }
}

/// The root message of a kind.
#[derive(Debug)]
pub(crate) struct Root {
    api_version: &'static str,
    kind: &'static str,
    message: &'static str,
}

impl Root {
    pub(crate) const fn new(
        api_version: &'static str,
        kind: &'static str,
        message: &'static str,
    ) -> Self {
        Self {
            api_version,
            kind,
            message,
        }
    }
}

fn message(name: &str) -> Option<&'static Message> {
    MESSAGES
        .binary_search_by(|m| m.name.cmp(name))
        .ok()
        .and_then(|i| MESSAGES.get(i))
}

/// The message a kind is encoded as. `DeleteOptions` is registered in every group version.
fn root(api_version: &str, kind: &str) -> Option<&'static Message> {
    ROOTS
        .iter()
        .find(|r| r.api_version == api_version && r.kind == kind)
        .and_then(|r| message(r.message))
        .or_else(|| (kind == "DeleteOptions").then(|| message(DELETE_OPTIONS))?)
}

// ---------------------------------------------------------------------------------------------
// The wire reader.

/// One field's value as it is on the wire.
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Len(&'a [u8]),
    Fixed32,
}

impl Wire<'_> {
    fn wire_type(&self) -> u8 {
        match self {
            Wire::Varint(_) => 0,
            Wire::Fixed64 => 1,
            Wire::Len(_) => 2,
            Wire::Fixed32 => 5,
        }
    }
}

#[derive(Debug)]
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn varint(&mut self) -> Result<u64, WireProblem> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let byte = *self.buf.get(self.pos).ok_or(WireProblem::TruncatedVarint)?;
            self.pos += 1;
            // The tenth byte holds the 64th bit only.
            if i == 9 && byte > 1 {
                return Err(WireProblem::OverlongVarint);
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(WireProblem::OverlongVarint)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], WireProblem> {
        let bytes = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.get(..N))
            .ok_or(WireProblem::TruncatedFixed(N))?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        self.pos += N;
        Ok(out)
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], WireProblem> {
        let len = self.varint()?;
        let remaining = self.remaining();
        match usize::try_from(len) {
            Ok(n) if n <= remaining => {
                let start = self.pos;
                self.pos += n;
                self.buf
                    .get(start..start + n)
                    .ok_or(WireProblem::LengthPastEnd { len, remaining })
            }
            _ => Err(WireProblem::LengthPastEnd { len, remaining }),
        }
    }

    /// The next field: its number and value, or `None` at the end.
    fn field(&mut self) -> Result<Option<(u32, Wire<'a>)>, WireProblem> {
        if self.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 || number >= 1 << 29 {
            return Err(WireProblem::InvalidFieldNumber(number));
        }
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.fixed::<8>()?;
                Wire::Fixed64
            }
            2 => Wire::Len(self.len_delimited()?),
            5 => {
                self.fixed::<4>()?;
                Wire::Fixed32
            }
            3 | 4 => return Err(WireProblem::Group),
            other => return Err(WireProblem::InvalidWireType(other as u8)),
        };
        // `number < 2^29` was checked above.
        Ok(Some((number as u32, value)))
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding.

/// Decodes a Kubernetes protobuf body (`k8s\0` + `runtime.Unknown`) into the JSON object the
/// client would have sent, with `apiVersion` and `kind` set from the envelope.
pub fn decode_k8s_protobuf(body: &[u8]) -> Result<Value, ProtobufError> {
    let data = body.strip_prefix(MAGIC).ok_or(ProtobufError::BadMagic)?;
    let Envelope {
        api_version,
        kind,
        raw,
    } = envelope(data)?;
    let kind = kind
        .filter(|k| !k.is_empty())
        .ok_or(ProtobufError::MissingTypeMeta("kind"))?;
    let api_version = api_version
        .filter(|v| !v.is_empty())
        .ok_or(ProtobufError::MissingTypeMeta("apiVersion"))?;
    let msg = root(&api_version, &kind).ok_or_else(|| ProtobufError::UnknownKind {
        api_version: api_version.clone(),
        kind: kind.clone(),
    })?;
    let mut object = Map::new();
    decode_message(msg, raw, &mut object, 1)?;
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(object))
}

/// The fields of `runtime.Unknown` the decoder uses.
#[derive(Debug, Default)]
struct Envelope<'a> {
    api_version: Option<String>,
    kind: Option<String>,
    raw: &'a [u8],
}

/// `runtime.Unknown`: apiVersion, kind and raw. Like the real server, it ignores
/// `contentEncoding` and `contentType`: clients leave them empty.
fn envelope(data: &[u8]) -> Result<Envelope<'_>, ProtobufError> {
    let mut out = Envelope::default();
    let mut r = Reader::new(data);
    while let Some((tag, value)) = r
        .field()
        .map_err(|p| malformed(UNKNOWN, "a field key", p))?
    {
        match tag {
            1 => {
                let type_meta = expect_len(UNKNOWN, "typeMeta (1)", value)?;
                let mut t = Reader::new(type_meta);
                while let Some((tag, value)) = t
                    .field()
                    .map_err(|p| malformed(TYPE_META, "a field key", p))?
                {
                    match tag {
                        1 => {
                            let v = expect_len(TYPE_META, "apiVersion (1)", value)?;
                            out.api_version = Some(string(v));
                        }
                        2 => out.kind = Some(string(expect_len(TYPE_META, "kind (2)", value)?)),
                        _ => {}
                    }
                }
            }
            2 => out.raw = expect_len(UNKNOWN, "raw (2)", value)?,
            _ => {}
        }
    }
    Ok(out)
}

fn malformed(
    message: &'static str,
    field: impl Into<String>,
    problem: WireProblem,
) -> ProtobufError {
    ProtobufError::Malformed {
        message,
        field: field.into(),
        problem,
    }
}

fn field_name(f: &Field) -> String {
    if f.presence == Presence::Inline {
        format!("inlined field ({})", f.tag)
    } else {
        format!("{} ({})", f.json, f.tag)
    }
}

fn wrong_wire(
    message: &'static str,
    field: String,
    got: Wire<'_>,
    expected: &'static str,
) -> ProtobufError {
    malformed(
        message,
        field,
        WireProblem::WrongWireType {
            got: got.wire_type(),
            expected,
        },
    )
}

fn expect_len<'a>(
    message: &'static str,
    field: &str,
    value: Wire<'a>,
) -> Result<&'a [u8], ProtobufError> {
    match value {
        Wire::Len(bytes) => Ok(bytes),
        other => Err(wrong_wire(
            message,
            field.to_owned(),
            other,
            "length-delimited (2)",
        )),
    }
}

fn expect_varint(
    message: &'static str,
    field: &str,
    value: Wire<'_>,
) -> Result<u64, ProtobufError> {
    match value {
        Wire::Varint(v) => Ok(v),
        other => Err(wrong_wire(message, field.to_owned(), other, "varint (0)")),
    }
}

/// Go converts without checking UTF-8, and its JSON encoder then writes U+FFFD for invalid
/// bytes; so does this.
fn string(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Decodes one message's fields into `out` (which may already hold fields: protobuf merges a
/// message that occurs twice, and inlined messages share their parent's object).
fn decode_message(
    msg: &'static Message,
    data: &[u8],
    out: &mut Map<String, Value>,
    depth: usize,
) -> Result<(), ProtobufError> {
    let mut r = Reader::new(data);
    while let Some((tag, value)) = r
        .field()
        .map_err(|p| malformed(msg.name, "a field key", p))?
    {
        // Unknown fields are skipped, as newer clients may send fields we do not know.
        let Some(f) = msg.field(tag) else { continue };
        match f.presence {
            Presence::Inline => {
                let bytes = expect_len(msg.name, &field_name(f), value)?;
                let inner = sub_message(msg, f, depth)?;
                decode_message(inner, bytes, out, depth + 1)?;
            }
            Presence::Repeated => {
                let slot = out
                    .entry(f.json)
                    .or_insert_with(|| Value::Array(Vec::new()));
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                if let Value::Array(items) = slot {
                    match (f.kind, value) {
                        (Kind::Bool | Kind::I32 | Kind::I64, Wire::Len(packed)) => {
                            unpack(msg, f, packed, items)?;
                        }
                        _ => items.push(scalar_or_message(msg, f, f.kind, value, depth)?),
                    }
                }
            }
            Presence::Wire | Presence::ZeroOmitted => match f.kind {
                Kind::Msg(_) => {
                    let bytes = expect_len(msg.name, &field_name(f), value)?;
                    let inner = sub_message(msg, f, depth)?;
                    let slot = out
                        .entry(f.json)
                        .or_insert_with(|| Value::Object(Map::new()));
                    if !slot.is_object() {
                        *slot = Value::Object(Map::new());
                    }
                    if let Value::Object(fields) = slot {
                        decode_message(inner, bytes, fields, depth + 1)?;
                    }
                }
                Kind::Map(value_kind) => {
                    let entry = expect_len(msg.name, &field_name(f), value)?;
                    let (k, v) = map_entry(msg, f, value_kind, entry, depth)?;
                    let slot = out
                        .entry(f.json)
                        .or_insert_with(|| Value::Object(Map::new()));
                    if !slot.is_object() {
                        *slot = Value::Object(Map::new());
                    }
                    if let Value::Object(entries) = slot {
                        entries.insert(k, v);
                    }
                }
                kind => {
                    let v = scalar_or_message(msg, f, kind, value, depth)?;
                    if f.presence == Presence::ZeroOmitted && is_zero(&v) {
                        out.remove(f.json);
                    } else {
                        out.insert(f.json.to_owned(), v);
                    }
                }
            },
        }
    }
    Ok(())
}

fn sub_message(
    msg: &'static Message,
    f: &'static Field,
    depth: usize,
) -> Result<&'static Message, ProtobufError> {
    if depth >= MAX_DEPTH {
        return Err(ProtobufError::TooDeep {
            message: msg.name,
            field: field_name(f),
        });
    }
    match f.kind {
        Kind::Msg(name) => message(name).ok_or_else(|| ProtobufError::InvalidValue {
            message: msg.name,
            field: field_name(f),
            problem: format!("the schema has no message {name}"),
        }),
        _ => Err(ProtobufError::InvalidValue {
            message: msg.name,
            field: field_name(f),
            problem: "the schema gives this field no message type".into(),
        }),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Null => true,
        _ => false,
    }
}

/// Packed repeated numbers: one length-delimited run of values.
fn unpack(
    msg: &'static Message,
    f: &'static Field,
    packed: &[u8],
    items: &mut Vec<Value>,
) -> Result<(), ProtobufError> {
    let mut r = Reader::new(packed);
    while !r.is_empty() {
        let value = Wire::Varint(
            r.varint()
                .map_err(|p| malformed(msg.name, field_name(f), p))?,
        );
        items.push(scalar(msg, f, f.kind, value)?);
    }
    Ok(())
}

fn scalar_or_message(
    msg: &'static Message,
    f: &'static Field,
    kind: Kind,
    value: Wire<'_>,
    depth: usize,
) -> Result<Value, ProtobufError> {
    match kind {
        Kind::Str | Kind::Bool | Kind::I32 | Kind::I64 | Kind::Bytes => scalar(msg, f, kind, value),
        _ => {
            let bytes = expect_len(msg.name, &field_name(f), value)?;
            embedded(msg, f, kind, bytes, depth)
        }
    }
}

fn scalar(
    msg: &'static Message,
    f: &'static Field,
    kind: Kind,
    value: Wire<'_>,
) -> Result<Value, ProtobufError> {
    let name = || field_name(f);
    Ok(match (kind, value) {
        (Kind::Str, Wire::Len(b)) => Value::String(string(b)),
        (Kind::Bytes, Wire::Len(b)) => Value::String(B64.encode(b)),
        (Kind::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
        // Protobuf writes negative int32s sign-extended to 64 bits; truncating recovers them.
        (Kind::I32, Wire::Varint(v)) => Value::from(v as i32),
        (Kind::I64, Wire::Varint(v)) => Value::from(v as i64),
        (Kind::Str | Kind::Bytes, other) => {
            return Err(wrong_wire(msg.name, name(), other, "length-delimited (2)"));
        }
        (_, other) => return Err(wrong_wire(msg.name, name(), other, "varint (0)")),
    })
}

/// A map entry: `key = 1` (a string), `value = 2`; either may be missing (then zero).
fn map_entry(
    msg: &'static Message,
    f: &'static Field,
    value_kind: &'static Kind,
    entry: &[u8],
    depth: usize,
) -> Result<(String, Value), ProtobufError> {
    if depth >= MAX_DEPTH {
        return Err(ProtobufError::TooDeep {
            message: msg.name,
            field: field_name(f),
        });
    }
    let mut key = String::new();
    let mut value = None;
    let mut r = Reader::new(entry);
    while let Some((tag, v)) = r
        .field()
        .map_err(|p| malformed(msg.name, field_name(f), p))?
    {
        match tag {
            1 => key = string(expect_len(msg.name, &field_name(f), v)?),
            2 => value = Some(scalar_or_message(msg, f, *value_kind, v, depth + 1)?),
            _ => {}
        }
    }
    let value = match value {
        Some(v) => v,
        None => zero(msg, f, *value_kind, depth + 1)?,
    };
    Ok((key, value))
}

/// The JSON of a value missing from a map entry: Go's zero value.
fn zero(
    msg: &'static Message,
    f: &'static Field,
    kind: Kind,
    depth: usize,
) -> Result<Value, ProtobufError> {
    Ok(match kind {
        Kind::Str | Kind::Bytes => Value::String(String::new()),
        Kind::Bool => Value::Bool(false),
        Kind::I32 | Kind::I64 => Value::from(0),
        other => embedded(msg, f, other, &[], depth)?,
    })
}

/// A length-delimited value of a message kind: a message, or a special type's JSON scalar.
fn embedded(
    msg: &'static Message,
    f: &'static Field,
    kind: Kind,
    bytes: &[u8],
    depth: usize,
) -> Result<Value, ProtobufError> {
    let invalid = |problem: String| ProtobufError::InvalidValue {
        message: msg.name,
        field: field_name(f),
        problem,
    };
    match kind {
        Kind::Msg(_) => {
            let inner = sub_message(msg, f, depth)?;
            let mut fields = Map::new();
            decode_message(inner, bytes, &mut fields, depth + 1)?;
            Ok(Value::Object(fields))
        }
        Kind::Quantity => {
            // An empty Quantity is Go's zero Quantity, "0".
            match last_bytes(msg, f, bytes)? {
                Some(v) => Ok(Value::String(string(v))),
                None => Ok(Value::String("0".into())),
            }
        }
        Kind::Time => {
            // Go writes a zero Time as an empty message, and its JSON is null.
            if bytes.is_empty() {
                return Ok(Value::Null);
            }
            // Time keeps whole seconds only (as upstream's Unmarshal does): its nanoseconds
            // are dropped.
            let mut seconds = 0i64;
            let mut r = Reader::new(bytes);
            while let Some((tag, v)) = r
                .field()
                .map_err(|p| malformed(msg.name, field_name(f), p))?
            {
                if tag == 1 {
                    seconds = expect_varint(msg.name, &field_name(f), v)? as i64;
                }
            }
            rfc3339(seconds).map_err(invalid)
        }
        Kind::IntOrString => {
            let (mut ty, mut int_val, mut str_val) = (0i64, 0i32, String::new());
            let mut r = Reader::new(bytes);
            while let Some((tag, v)) = r
                .field()
                .map_err(|p| malformed(msg.name, field_name(f), p))?
            {
                match tag {
                    1 => ty = expect_varint(msg.name, &field_name(f), v)? as i64,
                    2 => int_val = expect_varint(msg.name, &field_name(f), v)? as i32,
                    3 => str_val = string(expect_len(msg.name, &field_name(f), v)?),
                    _ => {}
                }
            }
            match ty {
                0 => Ok(Value::from(int_val)),
                1 => Ok(Value::String(str_val)),
                other => Err(invalid(format!("IntOrString of unknown type {other}"))),
            }
        }
        Kind::FieldsV1 => {
            // Go writes a FieldsV1 without bytes as null.
            let raw = last_bytes(msg, f, bytes)?.unwrap_or_default();
            if raw.is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_slice(raw)
                .map_err(|e| invalid(format!("the embedded object is not JSON: {e}")))
        }
        Kind::StrList => {
            let mut items = Vec::new();
            let mut r = Reader::new(bytes);
            while let Some((tag, v)) = r
                .field()
                .map_err(|p| malformed(msg.name, field_name(f), p))?
            {
                if tag == 1 {
                    items.push(Value::String(string(expect_len(
                        msg.name,
                        &field_name(f),
                        v,
                    )?)));
                }
            }
            Ok(Value::Array(items))
        }
        Kind::Map(_) => Err(invalid("a map cannot be a map's value".into())),
        Kind::Str | Kind::Bool | Kind::I32 | Kind::I64 | Kind::Bytes => {
            scalar(msg, f, kind, Wire::Len(bytes))
        }
    }
}

/// Field 1 of a single-field special type (Quantity's `string`, FieldsV1's `Raw`), the last
/// occurrence winning as protobuf wants.
fn last_bytes<'a>(
    msg: &'static Message,
    f: &'static Field,
    bytes: &'a [u8],
) -> Result<Option<&'a [u8]>, ProtobufError> {
    let mut found = None;
    let mut r = Reader::new(bytes);
    while let Some((tag, v)) = r
        .field()
        .map_err(|p| malformed(msg.name, field_name(f), p))?
    {
        if tag == 1 {
            found = Some(expect_len(msg.name, &field_name(f), v)?);
        }
    }
    Ok(found)
}

/// Go's zero time, 0001-01-01T00:00:00Z, is JSON null; the proto Timestamp's range ends at
/// 9999-12-31T23:59:59Z.
const GO_ZERO_TIME: i64 = -62_135_596_800;
const MAX_TIME: i64 = 253_402_300_799;

/// RFC 3339 in UTC, as Go's `Time` writes it (whole seconds).
fn rfc3339(secs: i64) -> Result<Value, String> {
    if secs == GO_ZERO_TIME {
        return Ok(Value::Null);
    }
    if !(GO_ZERO_TIME..=MAX_TIME).contains(&secs) {
        return Err(format!(
            "timestamp {secs}s is outside 0001-01-01..9999-12-31"
        ));
    }
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let in_day = secs.rem_euclid(86_400);
    let base = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        in_day / 3600,
        in_day / 60 % 60,
        in_day % 60
    );
    Ok(Value::String(format!("{base}Z")))
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`); exact over the whole Timestamp range, where jiff stops a day short.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_sorted_and_every_reference_resolves() {
        for pair in MESSAGES.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} >= {}",
                pair[0].name,
                pair[1].name
            );
        }
        let check = |owner: &str, kind: &Kind| {
            if let Kind::Msg(name) = kind {
                assert!(message(name).is_some(), "{owner} refers to missing {name}");
            }
        };
        for m in MESSAGES {
            for pair in m.fields.windows(2) {
                assert!(pair[0].tag < pair[1].tag, "{} tags out of order", m.name);
            }
            for f in m.fields {
                check(m.name, &f.kind);
                if let Kind::Map(v) = f.kind {
                    check(m.name, v);
                }
                if f.presence == Presence::Inline {
                    assert!(
                        matches!(f.kind, Kind::Msg(_)),
                        "{}: inline non-message",
                        m.name
                    );
                }
            }
        }
        for r in ROOTS {
            assert!(message(r.message).is_some(), "root {} missing", r.message);
        }
        assert!(root("v1", "Pod").is_some());
        assert!(root("apps/v1", "DeleteOptions").is_some());
        assert!(root("v1", "Bogus").is_none());
    }

    #[test]
    fn nesting_is_capped() {
        // The served schema is not recursive, so start near the cap: Pod.spec (2) ->
        // PodSpec.containers (2) -> Container.name (1) needs two more levels.
        let pod = root("v1", "Pod").unwrap();
        let raw = [0x12, 0x05, 0x12, 0x03, 0x0a, 0x01, b'c'];
        let mut out = Map::new();
        assert!(decode_message(pod, &raw, &mut out, MAX_DEPTH - 2).is_ok());
        let mut out = Map::new();
        let err = decode_message(pod, &raw, &mut out, MAX_DEPTH - 1).unwrap_err();
        assert!(
            matches!(&err, ProtobufError::TooDeep { message, field }
                if *message == "k8s.io.api.core.v1.PodSpec" && field == "containers (2)"),
            "{err}"
        );
    }

    #[test]
    fn varints() {
        let mut r = Reader::new(&[0x96, 0x01]);
        assert_eq!(r.varint(), Ok(150));
        let mut r = Reader::new(&[0xff; 10]);
        assert_eq!(r.varint(), Err(WireProblem::OverlongVarint));
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert_eq!(r.varint(), Ok(u64::MAX));
        let mut r = Reader::new(&[0x80, 0x80]);
        assert_eq!(r.varint(), Err(WireProblem::TruncatedVarint));
    }

    proptest::proptest! {
        #[test]
        fn dates_agree_with_jiff(secs in -62_135_596_799i64..253_402_000_000) {
            let t = k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
            let want = format!("{}Z", t.strftime("%Y-%m-%dT%H:%M:%S"));
            proptest::prop_assert_eq!(rfc3339(secs), Ok(Value::from(want)));
        }
    }

    #[test]
    fn times_read_like_go() {
        assert_eq!(rfc3339(0), Ok(Value::from("1970-01-01T00:00:00Z")));
        assert_eq!(rfc3339(GO_ZERO_TIME), Ok(Value::Null));
        assert!(rfc3339(MAX_TIME + 1).is_err());
        assert!(rfc3339(i64::MIN).is_err());
        assert_eq!(
            rfc3339(GO_ZERO_TIME + 1),
            Ok(Value::from("0001-01-01T00:00:01Z"))
        );
        assert_eq!(rfc3339(MAX_TIME), Ok(Value::from("9999-12-31T23:59:59Z")));
    }
}
