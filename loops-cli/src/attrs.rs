//! Run attributes on the command line: `--attr` filters (`loops runs`, the web UI's runs
//! page) and how values are shown.
//!
//! A filter is `KEY[:TYPE]OP VALUE` with no spaces, `OP` one of `=`, `>=` and `<=` (both
//! ends included), `TYPE` one of `str` (the default), `int` and `time`:
//!
//! - `repo=acme/api`: the string attribute `repo` equals `acme/api` (the value is taken
//!   as it is, `=` included);
//! - `issue:int=42`, `issue:int>=10`: an integer attribute (`i64`);
//! - `due:time<=2026-01-01T00:00:00Z`: a time attribute, given in RFC 3339 (UTC, `Z`) or in
//!   ms since the Unix epoch (`due:time>=1767225600000`).
//!
//! Ranges are for integers and times; repeat `--attr` to combine conditions (all must
//! hold), e.g. `--attr issue:int>=10 --attr issue:int<=20`.

use std::time::UNIX_EPOCH;

use loops_core::{AttributeFilter, AttributeValue};

use crate::output::rfc3339;

/// Parses one `--attr` filter (see the module's documentation for the syntax).
///
/// # Errors
/// What is wrong with it, in a sentence, for clap to show.
pub fn parse_attr(given: &str) -> Result<AttributeFilter, String> {
    let at = given.find(['=', '<', '>']).ok_or_else(|| {
        format!("`{given}` has no `=`, `>=` or `<=`: write KEY=VALUE (see `loops runs --help`)")
    })?;
    let (left, rest) = given.split_at(at);
    let (op, value) = if let Some(v) = rest.strip_prefix(">=") {
        (Op::AtLeast, v)
    } else if let Some(v) = rest.strip_prefix("<=") {
        (Op::AtMost, v)
    } else if let Some(v) = rest.strip_prefix('=') {
        (Op::Eq, v)
    } else {
        return Err(format!(
            "`{given}`: `<` and `>` are not operators here; use `<=` or `>=` (both ends included)"
        ));
    };
    let (key, kind) = match left.split_once(':') {
        Some((key, kind)) => (key, kind),
        None => (left, "str"),
    };
    if key.is_empty() {
        return Err(format!("`{given}` has no key before the operator"));
    }
    let value = match kind {
        "str" => AttributeValue::Str(value.to_owned()),
        "int" => AttributeValue::Int(
            value
                .parse()
                .map_err(|_| format!("`{value}` is not an integer (i64), in `{given}`"))?,
        ),
        "time" => AttributeValue::Time(parse_time(value).ok_or_else(|| {
            format!(
                "`{value}` is not a time: give RFC 3339 (2026-01-01T00:00:00Z) or ms since the Unix epoch, in `{given}`"
            )
        })?),
        other => {
            return Err(format!(
                "unknown type `{other}` in `{given}`: the types are str (the default), int and time"
            ));
        }
    };
    // A key or value no run can have matches nothing: say why instead of "no runs match".
    loops_core::check_attribute(key, &value)
        .map_err(|reason| format!("`{given}`: {reason}, so no run can have it"))?;
    let filter = AttributeFilter::eq(key, value.clone());
    Ok(match (op, value) {
        (Op::Eq, _) => filter,
        (_, AttributeValue::Str(_)) => {
            return Err(format!(
                "`{given}`: ranges are for int and time attributes (`KEY:int>=N`); a string matches by `=`"
            ));
        }
        (Op::AtLeast, AttributeValue::Int(n)) => AttributeFilter::int_range(key, n..=i64::MAX),
        (Op::AtMost, AttributeValue::Int(n)) => AttributeFilter::int_range(key, i64::MIN..=n),
        (Op::AtLeast, AttributeValue::Time(t)) => AttributeFilter::time_range(key, t..=u64::MAX),
        (Op::AtMost, AttributeValue::Time(t)) => AttributeFilter::time_range(key, 0..=t),
    })
}

#[derive(Clone, Copy)]
enum Op {
    Eq,
    AtLeast,
    AtMost,
}

/// A time as RFC 3339 or as ms since the Unix epoch.
fn parse_time(s: &str) -> Option<u64> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    let at = humantime::parse_rfc3339_weak(s).ok()?;
    u64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()
}

/// A value as the text forms show it: a string as it is, an integer in decimal, a time in
/// RFC 3339 (UTC; after year 9999 in words, as [`rfc3339`] shows it).
pub fn value_text(value: &AttributeValue) -> String {
    match value {
        AttributeValue::Str(s) => s.clone(),
        AttributeValue::Int(n) => n.to_string(),
        AttributeValue::Time(ms) => rfc3339(*ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_with_their_types_and_ranges() {
        assert_eq!(
            parse_attr("repo=acme/api=v2").unwrap(),
            AttributeFilter::eq("repo", "acme/api=v2")
        );
        assert_eq!(
            parse_attr("repo:str=").unwrap(),
            AttributeFilter::eq("repo", "")
        );
        assert_eq!(
            parse_attr("n:int=-4").unwrap(),
            AttributeFilter::eq("n", -4)
        );
        assert_eq!(
            parse_attr("n:int>=10").unwrap(),
            AttributeFilter::int_range("n", 10..=i64::MAX)
        );
        assert_eq!(
            parse_attr("n:int<=10").unwrap(),
            AttributeFilter::int_range("n", i64::MIN..=10)
        );
        assert_eq!(
            parse_attr("due:time=2026-01-01T00:00:00Z").unwrap(),
            AttributeFilter::eq("due", AttributeValue::Time(1_767_225_600_000))
        );
        assert_eq!(
            parse_attr("due:time>=1767225600000").unwrap(),
            AttributeFilter::time_range("due", 1_767_225_600_000..=u64::MAX)
        );
        for bad in [
            "repo",
            "=x",
            "n:int=4.5",
            "n:float=1",
            "due:time=tomorrow",
            "repo>=a",
            "n:int>4",
        ] {
            assert!(parse_attr(bad).is_err(), "{bad}");
        }
        // Keys and values no run can have are said so, with the rule they break.
        assert_eq!(
            parse_attr("bad key=x").unwrap_err(),
            "`bad key=x`: the key has a character other than ASCII letters, digits, `_`, `-` and `.`, so no run can have it"
        );
        let long = format!("repo={}", "x".repeat(513));
        assert!(
            parse_attr(&long)
                .unwrap_err()
                .ends_with("the string value is longer than 512 bytes, so no run can have it")
        );
    }

    #[test]
    fn values_show_as_text() {
        assert_eq!(value_text(&"a b".into()), "a b");
        assert_eq!(value_text(&AttributeValue::Int(-3)), "-3");
        assert_eq!(
            value_text(&AttributeValue::Time(1_767_225_600_000)),
            "2026-01-01T00:00:00.000Z"
        );
    }
}
