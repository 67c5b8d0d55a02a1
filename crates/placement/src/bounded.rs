//! Decoding request bodies in bounded memory. A body is read once into a buffer of at most its
//! handler's limit; what is decoded from it must not be many times larger. Two things make a
//! JSON body blow up when decoded: a generic tree (`serde_json::Value`: every scalar a
//! 32-byte node, every object a map), and typed structs much larger than their JSON (`{}` read
//! as a `Container` is over a kilobyte). So:
//!
//! - members are decoded typed, and only those used: [`at`] decodes one member at a path and
//!   skips the rest of the body without allocating;
//! - before a pod (or any large typed object) is decoded, [`check_at`] walks it once without
//!   allocating and refuses it when it holds more JSON values or objects than a real one can
//!   ([`POD_SHAPE`]).

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// How large a JSON value may be, counted in values (scalars, objects and arrays) and in
/// objects and arrays alone (each one becomes a struct or a collection when decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Values of any kind.
    pub values: usize,
    /// Objects and arrays.
    pub containers: usize,
}

/// What a pod may hold. The API server stores at most 1.5 MiB per object (etcd's request
/// limit) and refuses more than 256 KiB of annotations; a real pod, even one with dozens of
/// containers and hundreds of environment variables each, has a few thousand JSON values and
/// a few hundred objects. Decoded, a value costs ~100 bytes at most (a map entry of two
/// strings) and an object up to ~2 KiB (a `Container` or `Volume` with all its optional
/// members), so this bounds a decoded pod to a few MiB whatever its JSON says
/// (`tensile bench hostile-bodies` measures it), while no pod the API server would store is
/// refused in practice.
pub const POD_SHAPE: Shape = Shape {
    values: 20_000,
    containers: 2_048,
};

/// Where a member is looked for: keys compared exactly (Kubernetes' own JSON), or ignoring
/// ASCII case (Go's `encoding/json`, which kube-scheduler's untagged extender types rely on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// `object` is only `object`.
    Exact,
    /// `Pod`, `pod` and `POD` are one member.
    AnyCase,
}

impl Keys {
    fn matches(self, key: &str, name: &str) -> bool {
        match self {
            Keys::Exact => key == name,
            Keys::AnyCase => key.eq_ignore_ascii_case(name),
        }
    }
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON at all (or cut short).
    #[error("not JSON: {0}")]
    Syntax(serde_json::Error),
    /// JSON, but not of the expected shape or types.
    #[error("{0}")]
    Data(serde_json::Error),
}

impl From<serde_json::Error> for DecodeError {
    fn from(e: serde_json::Error) -> Self {
        if e.is_syntax() || e.is_eof() {
            Self::Syntax(e)
        } else {
            Self::Data(e)
        }
    }
}

/// The member at `path` (object keys, outermost first) decoded as `T`, which may borrow from
/// the body (`&RawValue`); `None` when it is missing or `null`. The rest of the body is parsed
/// but not kept. When the key occurs more than once the last one counts (as in Go and in
/// `serde_json::Value`).
pub fn at<'de, T: de::Deserialize<'de>>(
    body: &'de [u8],
    path: &[&str],
    keys: Keys,
) -> Result<Option<T>, DecodeError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = Path {
        path,
        keys,
        seed: PhantomData::<T>,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Refuses the body when a member at `path` (every occurrence) is larger than `limits`, or when
/// the body is not JSON. Allocates nothing per value.
pub fn check_at(body: &[u8], path: &[&str], keys: Keys, limits: Shape) -> Result<(), DecodeError> {
    let counted = Cell::new(Shape {
        values: 0,
        containers: 0,
    });
    let mut de = serde_json::Deserializer::from_slice(body);
    Path {
        path,
        keys,
        seed: Walk {
            counted: &counted,
            limits,
        },
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(())
}

/// Follows `path` through nested objects, then hands the value found to `seed`.
struct Path<'p, S> {
    path: &'p [&'p str],
    keys: Keys,
    seed: S,
}

impl<'de, S> DeserializeSeed<'de> for Path<'_, S>
where
    S: DeserializeSeed<'de> + Clone,
{
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match self.path.split_first() {
            None => d.deserialize_option(Nullable(self.seed)),
            Some(_) => d
                .deserialize_option(Nullable(Members(self)))
                .map(Option::flatten),
        }
    }
}

/// The members of an object at one level of a [`Path`].
struct Members<'p, S>(Path<'p, S>);

impl<S: Clone> Clone for Members<'_, S> {
    fn clone(&self) -> Self {
        Self(Path {
            path: self.0.path,
            keys: self.0.keys,
            seed: self.0.seed.clone(),
        })
    }
}

impl<'de, S> DeserializeSeed<'de> for Members<'_, S>
where
    S: DeserializeSeed<'de> + Clone,
{
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, S> Visitor<'de> for Members<'_, S>
where
    S: DeserializeSeed<'de> + Clone,
{
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let Path { path, keys, seed } = self.0;
        let Some((name, rest)) = path.split_first() else {
            return Err(de::Error::custom("empty path"));
        };
        let mut found = None;
        while let Some(key) = map.next_key::<Key>()? {
            if keys.matches(&key.0, name) {
                found = map.next_value_seed(Path {
                    path: rest,
                    keys,
                    seed: seed.clone(),
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// An object key, cut to 64 characters: no key looked for is longer, and a longer one is not
/// kept whole.
#[derive(Debug)]
pub struct Key(pub String);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.chars().take(64).collect()))
            }
        }
        d.deserialize_str(V)
    }
}

/// `null` is `None`, anything else goes to the seed.
struct Nullable<S>(S);

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// Walks a value, counting against limits; keeps nothing.
#[derive(Clone, Copy)]
struct Walk<'c> {
    counted: &'c Cell<Shape>,
    limits: Shape,
}

impl Walk<'_> {
    fn count<E: de::Error>(&self, container: bool) -> Result<(), E> {
        let mut c = self.counted.get();
        c.values += 1;
        c.containers += usize::from(container);
        self.counted.set(c);
        if c.values > self.limits.values {
            return Err(E::custom(format!(
                "it holds more than {} JSON values",
                self.limits.values
            )));
        }
        if c.containers > self.limits.containers {
            return Err(E::custom(format!(
                "it holds more than {} JSON objects and arrays",
                self.limits.containers
            )));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.count(false)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.count(false)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.count(false)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.count(false)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.count(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.count(false)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.count(false)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.count(true)?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.count(true)?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// A string member that may turn out not to be one: decoded without keeping anything else.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Text {
    /// Missing or `null`.
    #[default]
    Absent,
    /// A string.
    Str(String),
    /// Anything else (skipped).
    Other,
}

impl<'de> de::Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text::Str(v.to_owned()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::Absent)
            }
            fn visit_none<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::Absent)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Text, E> {
                Ok(Text::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Text, E> {
                Ok(Text::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Text, E> {
                Ok(Text::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Text, E> {
                Ok(Text::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of at most `MAX` elements: a longer one is refused as soon as it is seen to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded<T, const MAX: usize>(pub Vec<T>);

impl<T, const MAX: usize> Default for Bounded<T, MAX> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<'de, T: de::Deserialize<'de>, const MAX: usize> de::Deserialize<'de> for Bounded<T, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const MAX: usize>(PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>, const MAX: usize> Visitor<'de> for V<T, MAX> {
            type Value = Bounded<T, MAX>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {MAX} elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element()? {
                    if out.len() == MAX {
                        return Err(de::Error::custom(format!(
                            "a list of more than {MAX} elements"
                        )));
                    }
                    out.push(item);
                }
                Ok(Bounded(out))
            }
        }
        d.deserialize_seq(V::<T, MAX>(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_decoded_and_the_rest_skipped() {
        let body = br#"{"junk": [1, {"a": 2}], "Request": {"object": {"n": 1}}, "request": {"x": 0, "object": {"n": 2}}}"#;
        let got: Option<serde_json::Value> = at(body, &["request", "object"], Keys::Exact).unwrap();
        assert_eq!(got, Some(serde_json::json!({"n": 2})));
        // Any case: the last occurrence counts, as Go's decoder does.
        let got: Option<serde_json::Value> =
            at(body, &["REQUEST", "object"], Keys::AnyCase).unwrap();
        assert_eq!(got, Some(serde_json::json!({"n": 2})));
        let none: Option<u8> = at(br#"{"a": null}"#, &["a"], Keys::Exact).unwrap();
        assert_eq!(none, None);
        let none: Option<u8> = at(br#"{"b": 1}"#, &["a", "c"], Keys::Exact).unwrap();
        assert_eq!(none, None);
        assert!(matches!(
            at::<u8>(b"{\"a\": ", &["a"], Keys::Exact),
            Err(DecodeError::Syntax(_))
        ));
        let err = at::<u8>(b"[1]", &["a"], Keys::Exact).unwrap_err();
        assert!(err.to_string().contains("expected a JSON object"), "{err}");
    }

    #[test]
    fn a_member_larger_than_its_limits_is_refused_before_it_is_decoded() {
        let limits = Shape {
            values: 10,
            containers: 3,
        };
        assert!(check_at(br#"{"p": {"a": [1, 2, 3]}}"#, &["p"], Keys::Exact, limits).is_ok());
        let many = format!(r#"{{"p": [{}]}}"#, ["0"; 11].join(","));
        let err = check_at(many.as_bytes(), &["p"], Keys::Exact, limits).unwrap_err();
        assert!(
            err.to_string().contains("more than 10 JSON values"),
            "{err}"
        );
        let err = check_at(br#"{"p": [{}, {}, {}]}"#, &["p"], Keys::Exact, limits).unwrap_err();
        assert!(
            err.to_string().contains("more than 3 JSON objects"),
            "{err}"
        );
        // Every occurrence is walked, not only the last.
        let twice = format!(r#"{{"p": [{}], "p": 1}}"#, ["0"; 11].join(","));
        assert!(check_at(twice.as_bytes(), &["P"], Keys::AnyCase, limits).is_err());
        // Outside the path, nothing is counted.
        assert!(check_at(many.as_bytes(), &["q"], Keys::Exact, limits).is_ok());
    }

    #[test]
    fn texts_and_bounded_lists() {
        let t: Text = serde_json::from_str(r#""x""#).unwrap();
        assert_eq!(t, Text::Str("x".into()));
        let t: Text = serde_json::from_str(r#"{"a": [1]}"#).unwrap();
        assert_eq!(t, Text::Other);
        let l: Bounded<u8, 2> = serde_json::from_str("[1, 2]").unwrap();
        assert_eq!(l.0, [1, 2]);
        assert!(serde_json::from_str::<Bounded<u8, 2>>("[1, 2, 3]").is_err());
    }
}
