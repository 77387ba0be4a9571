//! Searchable attributes of a run: what they are ([`AttributeValue`]), the rules for their
//! keys and values ([`check_attribute`]), their index encoding ([`AttributeValue::index_bytes`],
//! the same bytes in every store), and which runs a search selects ([`RunFilter`]).
//!
//! An attribute is a `(key, value)` pair recorded for a run, by its handler
//! ([`Context::set_attribute`](crate::Context::set_attribute)) or at its start
//! ([`StartOptions::attribute`](crate::StartOptions::attribute)). A run has at most one value
//! per key: setting a key again replaces its value. Attributes are stored in plaintext, even
//! when a payload codec seals the records: they are meant to be searched.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::row::RunInfo;
use crate::status::RunStatus;

/// Longest attribute key, in bytes.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 64;

/// Longest string value of an attribute, in bytes (UTF-8).
pub const MAX_ATTRIBUTE_STRING_BYTES: usize = 512;

/// A run's attributes, by key.
pub type Attributes = BTreeMap<String, AttributeValue>;

/// The value of a run's attribute: a string, an integer or a time.
///
/// JSON form (serde, externally tagged): `{"str":"acme/api"}`, `{"int":42}`,
/// `{"time_ms":1767225600000}` (a time is ms since the Unix epoch). Values of different types
/// never equal each other: `{"int":42}` does not match `{"str":"42"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AttributeValue {
    /// A string, at most [`MAX_ATTRIBUTE_STRING_BYTES`] bytes.
    #[serde(rename = "str")]
    Str(String),
    /// A signed 64-bit integer.
    #[serde(rename = "int")]
    Int(i64),
    /// A time, in ms since the Unix epoch.
    #[serde(rename = "time_ms")]
    Time(u64),
}

/// The first byte of each type's index encoding: types sort apart, never mixed.
const TAG_STR: u8 = 1;
const TAG_INT: u8 = 2;
const TAG_TIME: u8 = 3;

impl AttributeValue {
    /// A time value from a [`SystemTime`] (ms since the Unix epoch; a time before the epoch
    /// is the epoch, one past `u64::MAX` ms is `u64::MAX`).
    pub fn time(at: SystemTime) -> AttributeValue {
        AttributeValue::Time(crate::clock::epoch_ms(at))
    }

    /// The type's name as the CLI and the docs spell it: `"str"`, `"int"` or `"time"`.
    pub fn kind(&self) -> &'static str {
        match self {
            AttributeValue::Str(_) => "str",
            AttributeValue::Int(_) => "int",
            AttributeValue::Time(_) => "time",
        }
    }

    /// The value's bytes in an attribute index: a type tag, then bytes whose lexicographic
    /// (memcmp) order is the values' order: a string's UTF-8; an integer big-endian with its
    /// sign bit flipped; a time big-endian. Every store indexes these bytes (redb in its key,
    /// PostgreSQL as `bytea`), so a range of values is a range of keys.
    pub fn index_bytes(&self) -> Vec<u8> {
        match self {
            AttributeValue::Str(s) => {
                let mut out = Vec::with_capacity(1 + s.len());
                out.push(TAG_STR);
                out.extend_from_slice(s.as_bytes());
                out
            }
            AttributeValue::Int(n) => {
                let mut out = vec![TAG_INT];
                out.extend_from_slice(&((*n as u64) ^ (1 << 63)).to_be_bytes());
                out
            }
            AttributeValue::Time(ms) => {
                let mut out = vec![TAG_TIME];
                out.extend_from_slice(&ms.to_be_bytes());
                out
            }
        }
    }

    /// The value whose [`index_bytes`](Self::index_bytes) are `bytes`, or `None` if they are
    /// not such bytes.
    pub fn from_index_bytes(bytes: &[u8]) -> Option<AttributeValue> {
        let (&tag, rest) = bytes.split_first()?;
        match tag {
            TAG_STR => std::str::from_utf8(rest)
                .ok()
                .map(|s| AttributeValue::Str(s.to_owned())),
            TAG_INT => {
                let raw = u64::from_be_bytes(rest.try_into().ok()?);
                Some(AttributeValue::Int((raw ^ (1 << 63)) as i64))
            }
            TAG_TIME => Some(AttributeValue::Time(u64::from_be_bytes(
                rest.try_into().ok()?,
            ))),
            _ => None,
        }
    }
}

impl From<&str> for AttributeValue {
    fn from(s: &str) -> Self {
        AttributeValue::Str(s.to_owned())
    }
}

impl From<String> for AttributeValue {
    fn from(s: String) -> Self {
        AttributeValue::Str(s)
    }
}

impl From<i64> for AttributeValue {
    fn from(n: i64) -> Self {
        AttributeValue::Int(n)
    }
}

impl From<i32> for AttributeValue {
    fn from(n: i32) -> Self {
        AttributeValue::Int(n.into())
    }
}

impl From<u32> for AttributeValue {
    fn from(n: u32) -> Self {
        AttributeValue::Int(n.into())
    }
}

impl From<SystemTime> for AttributeValue {
    fn from(at: SystemTime) -> Self {
        AttributeValue::time(at)
    }
}

impl std::fmt::Display for AttributeValue {
    /// A string as it is, an integer in decimal, a time as `<ms> ms` since the epoch.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttributeValue::Str(s) => f.write_str(s),
            AttributeValue::Int(n) => write!(f, "{n}"),
            AttributeValue::Time(ms) => write!(f, "{ms} ms"),
        }
    }
}

/// The prefix of the attribute keys loops sets itself (such as
/// [`SCHEDULE_ATTRIBUTE`](crate::SCHEDULE_ATTRIBUTE)): a run's own code cannot set them, so
/// that a search by them finds only what loops recorded.
pub const RESERVED_ATTRIBUTE_PREFIX: &str = "loops.";

/// Refuses a key a run's own code sets (through `Context::set_attribute`, `StartOptions` or
/// `ChildOptions`) that starts with [`RESERVED_ATTRIBUTE_PREFIX`]: the reason, in a few words.
pub(crate) fn refuse_reserved(key: &str) -> Result<(), &'static str> {
    if key.starts_with(RESERVED_ATTRIBUTE_PREFIX) {
        return Err("keys that start with `loops.` are loops' own (such as `loops.schedule`)");
    }
    Ok(())
}

/// Checks an attribute: its key is 1 to [`MAX_ATTRIBUTE_KEY_BYTES`] bytes of ASCII letters,
/// digits, `_`, `-` and `.`; a string value is at most [`MAX_ATTRIBUTE_STRING_BYTES`] bytes.
/// Integers and times are always valid.
///
/// # Errors
/// Why the attribute is refused, in a few words (the caller names the run, state and seq:
/// [`Error::InvalidAttribute`](crate::Error::InvalidAttribute)).
pub fn check_attribute(key: &str, value: &AttributeValue) -> Result<(), &'static str> {
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.len() > MAX_ATTRIBUTE_KEY_BYTES {
        return Err("the key is longer than 64 bytes");
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err("the key has a character other than ASCII letters, digits, `_`, `-` and `.`");
    }
    if let AttributeValue::Str(s) = value
        && s.len() > MAX_ATTRIBUTE_STRING_BYTES
    {
        return Err("the string value is longer than 512 bytes");
    }
    Ok(())
}

/// One condition on a run's attribute: its value for `key` lies in an inclusive range of
/// values of one type (equality is the range of one value). A run without the key, or with a
/// value of another type, does not match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttributeFilter {
    /// The attribute's key.
    pub key: String,
    /// The lowest value that matches.
    pub min: AttributeValue,
    /// The highest value that matches (of `min`'s type; otherwise nothing matches).
    pub max: AttributeValue,
}

impl AttributeFilter {
    /// Runs whose `key` equals `value` (same type, same value).
    pub fn eq(key: impl Into<String>, value: impl Into<AttributeValue>) -> AttributeFilter {
        let value = value.into();
        AttributeFilter {
            key: key.into(),
            min: value.clone(),
            max: value,
        }
    }

    /// Runs whose integer `key` lies in `range` (both ends included).
    pub fn int_range(key: impl Into<String>, range: RangeInclusive<i64>) -> AttributeFilter {
        let (min, max) = range.into_inner();
        AttributeFilter {
            key: key.into(),
            min: AttributeValue::Int(min),
            max: AttributeValue::Int(max),
        }
    }

    /// Runs whose time `key` lies in `range`, in ms since the Unix epoch (both ends included).
    pub fn time_range(key: impl Into<String>, range: RangeInclusive<u64>) -> AttributeFilter {
        let (min, max) = range.into_inner();
        AttributeFilter {
            key: key.into(),
            min: AttributeValue::Time(min),
            max: AttributeValue::Time(max),
        }
    }

    /// Whether `value` (the run's value for [`key`](Self::key)) matches.
    pub fn matches(&self, value: &AttributeValue) -> bool {
        let bytes = value.index_bytes();
        let (lo, hi) = self.index_range();
        bytes >= lo && bytes < hi
    }

    /// The range of [`index_bytes`](AttributeValue::index_bytes) that match, as `(lowest
    /// included, lowest excluded)`: what a store scans in its index of `key`. Empty (`lo >=
    /// hi`) when the ends are of different types or `min > max`.
    pub fn index_range(&self) -> (Vec<u8>, Vec<u8>) {
        let lo = self.min.index_bytes();
        let mut hi = self.max.index_bytes();
        if self.min.kind() != self.max.kind() {
            return (lo.clone(), lo);
        }
        // The successor of `max`'s bytes: every longer string that starts with them is above.
        hi.push(0);
        (lo, hi)
    }
}

/// Which runs a search selects ([`Runtime::list_runs_where`](crate::Runtime::list_runs_where),
/// [`Store::search`](crate::Store::search)): every condition given must hold.
///
/// A store finds the candidates through its attribute index, by the first attribute filter
/// (put the most selective first), and keeps those that [`matches`](Self::matches) accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFilter {
    /// Only runs with one of these statuses (any status when empty).
    #[serde(default)]
    pub statuses: Vec<RunStatus>,
    /// Only runs of this workflow.
    #[serde(default)]
    pub workflow: Option<String>,
    /// Only runs whose attributes match every one of these.
    #[serde(default)]
    pub attributes: Vec<AttributeFilter>,
    /// Only runs last changed at or after this time (ms since the Unix epoch).
    #[serde(default)]
    pub updated_from_ms: Option<u64>,
    /// Only runs last changed before this time (ms since the Unix epoch).
    #[serde(default)]
    pub updated_before_ms: Option<u64>,
}

impl RunFilter {
    /// A filter that selects every run (add conditions with the other methods).
    pub fn new() -> RunFilter {
        RunFilter::default()
    }

    /// Also only runs with `status` (several calls: any of them).
    pub fn status(mut self, status: RunStatus) -> RunFilter {
        self.statuses.push(status);
        self
    }

    /// Also only runs of `workflow`.
    pub fn workflow(mut self, workflow: impl Into<String>) -> RunFilter {
        self.workflow = Some(workflow.into());
        self
    }

    /// Also only runs whose `key` equals `value`.
    pub fn attribute(self, key: impl Into<String>, value: impl Into<AttributeValue>) -> RunFilter {
        self.where_attribute(AttributeFilter::eq(key, value))
    }

    /// Also only runs whose attributes match `filter`.
    pub fn where_attribute(mut self, filter: AttributeFilter) -> RunFilter {
        self.attributes.push(filter);
        self
    }

    /// The attribute filter a store finds candidates by (the first one), or `None`.
    pub fn driving(&self) -> Option<&AttributeFilter> {
        self.attributes.first()
    }

    /// Whether the run with row `info` and attributes `attributes` is selected: the one rule
    /// every store applies to the candidates its index gives.
    pub fn matches(&self, info: &RunInfo, attributes: &Attributes) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&info.status))
            && self.workflow.as_ref().is_none_or(|w| *w == info.workflow)
            && self.updated_from_ms.is_none_or(|t| info.updated_ms >= t)
            && self.updated_before_ms.is_none_or(|t| info.updated_ms < t)
            && self
                .attributes
                .iter()
                .all(|f| attributes.get(&f.key).is_some_and(|value| f.matches(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_bytes_sort_as_values_and_read_back() {
        let values = [
            AttributeValue::Str(String::new()),
            AttributeValue::Str("a".into()),
            AttributeValue::Str("a\0".into()),
            AttributeValue::Str("ab".into()),
            AttributeValue::Int(i64::MIN),
            AttributeValue::Int(-1),
            AttributeValue::Int(0),
            AttributeValue::Int(1),
            AttributeValue::Int(i64::MAX),
            AttributeValue::Time(0),
            AttributeValue::Time(1_767_225_600_000),
            AttributeValue::Time(u64::MAX),
        ];
        for pair in values.windows(2) {
            assert!(pair[0].index_bytes() < pair[1].index_bytes(), "{pair:?}");
        }
        for v in &values {
            assert_eq!(
                AttributeValue::from_index_bytes(&v.index_bytes()).as_ref(),
                Some(v)
            );
        }
        assert_eq!(AttributeValue::from_index_bytes(&[9, 1]), None);
        assert_eq!(AttributeValue::from_index_bytes(&[TAG_INT, 1]), None);
        assert_eq!(AttributeValue::from_index_bytes(&[]), None);
    }

    #[test]
    fn filters_match_their_range_of_one_type() {
        let eq = AttributeFilter::eq("repo", "acme/api");
        assert!(eq.matches(&"acme/api".into()));
        assert!(!eq.matches(&"acme/api2".into()));
        assert!(!eq.matches(&"acme/ap".into()));
        let n = AttributeFilter::int_range("n", -5..=10);
        assert_eq!(
            [-6, -5, 0, 10, 11].map(|v| n.matches(&AttributeValue::Int(v))),
            [false, true, true, true, false]
        );
        assert!(!n.matches(&AttributeValue::Time(3)));
        assert!(!AttributeFilter::eq("n", 42).matches(&"42".into()));
        let mixed = AttributeFilter {
            key: "n".into(),
            min: AttributeValue::Int(0),
            max: AttributeValue::Time(9),
        };
        assert!(!mixed.matches(&AttributeValue::Int(1)));
        assert!(!mixed.matches(&AttributeValue::Time(1)));
    }

    #[test]
    fn keys_and_values_are_checked() {
        let ok = AttributeValue::Int(1);
        assert_eq!(check_attribute("repo.name_2-x", &ok), Ok(()));
        assert_eq!(check_attribute("", &ok), Err("the key is empty"));
        assert!(check_attribute(&"k".repeat(65), &ok).is_err());
        assert_eq!(check_attribute(&"k".repeat(64), &ok), Ok(()));
        assert!(check_attribute("a=b", &ok).is_err());
        assert!(check_attribute("a:b", &ok).is_err());
        assert!(check_attribute("k", &AttributeValue::Str("x".repeat(513))).is_err());
        assert_eq!(
            check_attribute("k", &AttributeValue::Str("x".repeat(512))),
            Ok(())
        );
    }

    #[test]
    fn json_form_is_tagged_by_type() {
        let attrs: Attributes = [
            ("a".to_owned(), AttributeValue::Str("x".into())),
            ("b".to_owned(), AttributeValue::Int(-2)),
            ("c".to_owned(), AttributeValue::Time(7)),
        ]
        .into();
        assert_eq!(
            serde_json::to_string(&attrs).unwrap(),
            r#"{"a":{"str":"x"},"b":{"int":-2},"c":{"time_ms":7}}"#
        );
    }
}
