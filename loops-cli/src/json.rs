//! Stored JSON, re-indented for people without reordering object keys.
//!
//! `serde_json::Value` sorts object keys (unless its `preserve_order` feature is on, which
//! would change the map type for every crate of the workspace); a state's fields read best
//! in the order the workflow declares them, so the CLI keeps that order with its own value.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;

/// A JSON value whose objects keep their keys in the order written.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(t) => s.serialize_str(t),
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        Json::deserialize(d)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(n)
            .map(Json::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut fields = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            fields.push((k, v));
        }
        Ok(Json::Object(fields))
    }
}

/// `raw` JSON indented over several lines, keys in their stored order; `raw` itself if it
/// does not parse.
pub fn pretty(raw: &str) -> String {
    serde_json::from_str::<Json>(raw)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| raw.to_owned())
}

/// `raw` JSON on one line, cut to at most `max` characters (ending in `…` when cut).
pub fn preview(raw: &str, max: usize) -> String {
    let compact = serde_json::from_str::<Json>(raw)
        .ok()
        .and_then(|v| serde_json::to_string(&v).ok())
        .unwrap_or_else(|| crate::failure::one_line(raw));
    cut(compact, max)
}

/// `text` cut to at most `max` characters, ending in `…` when cut: for a table's cell that
/// must not widen its column for every row (a payload, a long idempotency key); the whole
/// text is in `--json`.
pub fn cut(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        text
    } else {
        let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// A payload given as JSON text (`loops send`, the UI's send form), kept as written, once it
/// reads as a value too: the parse of a `RawValue` checks the syntax only and takes a
/// string's lone surrogate escape (`"\ud800"`, no character), which no payload type reads and
/// the run's check would refuse only after the store was reached.
///
/// # Errors
/// What is wrong, to follow the payload's name ("the payload ..."): `is not valid JSON: ` and
/// serde_json's error, with its line and column (`EOF while parsing a value at line 1 column
/// 3`); for a lone surrogate escape, that it holds one, with serde_json's error; or, for
/// arrays and objects nested deeper than serde_json reads (and so than any worker decodes),
/// how deep.
pub fn payload(text: &str) -> Result<Box<RawValue>, String> {
    let depth = nesting(text);
    if depth > MAX_NESTING {
        return Err(format!(
            "nests arrays and objects {depth} deep, and a payload may nest at most {MAX_NESTING} (serde_json's limit, which workers decode with)"
        ));
    }
    let invalid = |e: serde_json::Error| format!("is not valid JSON: {e}");
    let payload: Box<RawValue> = serde_json::from_str(text).map_err(invalid)?;
    // The syntax holds, so what the value's parse refuses is a string's escape of no
    // character (the one thing a `RawValue` takes that a value does not).
    serde_json::from_str::<serde_json::Value>(text).map_err(|e| {
        format!(
            "holds a lone surrogate escape (such as \\ud800 without its pair), which is no \
             character and no payload can hold: {e}"
        )
    })?;
    Ok(payload)
}

/// How deep serde_json nests arrays and objects before it refuses a document.
const MAX_NESTING: usize = 127;

/// The deepest nesting of arrays and objects in `text` (brackets in strings not counted); on
/// text that is not JSON, a count the parser's own error then supersedes.
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in text.bytes() {
        match (in_string, byte) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') | (false, b'"') => in_string = !in_string,
            (false, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order() {
        let raw = r#"{"Work":{"zeta":1,"alpha":[true,null,-2,1.5,"s"]}}"#;
        assert_eq!(
            pretty(raw),
            "{\n  \"Work\": {\n    \"zeta\": 1,\n    \"alpha\": [\n      true,\n      null,\n      -2,\n      1.5,\n      \"s\"\n    ]\n  }\n}"
        );
        assert_eq!(preview(raw, 200), raw);
        assert_eq!(preview("{ \"a\" :  1 }", 200), r#"{"a":1}"#);
        assert_eq!(preview(r#""abcdefgh""#, 5), "\"abc…");
        assert_eq!(pretty("not json"), "not json");
    }

    #[test]
    fn nesting_deeper_than_serde_json_reads_is_said_so() {
        let at = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(payload(&at(MAX_NESTING)).is_ok());
        assert_eq!(
            payload(&at(MAX_NESTING + 1)).unwrap_err(),
            "nests arrays and objects 128 deep, and a payload may nest at most 127 (serde_json's limit, which workers decode with)"
        );
        // Brackets in strings (escaped quotes too) are text.
        assert_eq!(nesting(r#"{"a":"[[\"[{","b":[{}]}"#), 3);
        assert!(payload(&format!(r#"{{"a":"{}"}}"#, "[".repeat(500))).is_ok());
        assert_eq!(
            payload("[1,").unwrap_err(),
            "is not valid JSON: EOF while parsing a value at line 1 column 3"
        );
    }
}
