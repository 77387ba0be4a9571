//! The rules for the names a caller chooses: run ids, step and event names, idempotency keys.

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};

use crate::error::{Error, Result};

/// Longest run id, in bytes.
pub const MAX_RUN_ID_BYTES: usize = 256;

/// Longest step or event name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Prefix of the step names loops records for sleeps and waits; user step names may not start
/// with it.
pub const RESERVED_PREFIX: &str = "loops:";

/// The event a child run's end sends to its parent, in the commit that ends the child (its
/// payload: `{"child": CHILD_ID}`): what wakes a parent waiting to join its children
/// ([`Context::join_child`](crate::Context::join_child)).
pub const CHILD_ENDED: &str = "loops:child-ended";

pub use crate::bidi::{escape_bidi_controls, is_bidi_control, replace_bidi_controls};

/// Checks the id of a new run: the rules of [`validate_run_id_lookup`] (not empty, at most
/// [`MAX_RUN_ID_BYTES`] bytes, no control characters, no white space at either end), no
/// bidirectional control character (Unicode's Bidi_Control: U+061C, U+200E, U+200F, U+202A to
/// U+202E, U+2066 to U+2069; with them, an id and the text after it show in an order other
/// than their own, in a terminal, a log or a branch name), and not only invisible characters
/// (white space and Unicode format characters, general category Cf), and not `.` or `..`
/// (a URL's dot segments: the web UI could not link to the run). Any other Unicode is
/// accepted, U+200D ZERO WIDTH JOINER inside an emoji sequence included. The runtime checks
/// it where it creates a run; runs stored before the last three rules are still found, driven
/// and steered by their ids.
///
/// # Errors
/// [`Error::InvalidRunId`](crate::Error::InvalidRunId) saying which rule the id breaks.
pub fn validate_run_id(run_id: &str) -> Result<()> {
    validate_run_id_lookup(run_id)?;
    let reason = if run_id.chars().any(is_bidi_control) {
        "contains bidirectional control characters (Unicode Bidi_Control), which make text show in an order other than its own"
    } else if run_id
        .chars()
        .all(|c| c.is_whitespace() || c.general_category() == GeneralCategory::Format)
    {
        "holds only invisible characters (white space or Unicode format characters, Cf)"
    } else if run_id == "." || run_id == ".." {
        "is `.` or `..`, which a URL (the web UI's, the control endpoint's) reads as a step in its path, not as a run"
    } else {
        return Ok(());
    };
    Err(Error::InvalidRunId {
        run_id: run_id.to_owned(),
        reason,
    })
}

/// Checks a run id given to find a run (to read it, send it an event, cancel, retry or resume
/// it): not empty, at most [`MAX_RUN_ID_BYTES`] bytes, no control characters, no white space
/// at either end. The rules of [`validate_run_id`] less the ones it added later (no
/// bidirectional controls, not only invisible characters), so that a run stored before them
/// is still reached by its id.
///
/// # Errors
/// [`Error::InvalidRunId`](crate::Error::InvalidRunId) saying which rule the id breaks.
pub fn validate_run_id_lookup(run_id: &str) -> Result<()> {
    let reason = if run_id.is_empty() {
        "empty"
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        "longer than 256 bytes"
    } else if run_id.chars().any(char::is_control) {
        "contains control characters"
    } else if run_id.starts_with(char::is_whitespace) || run_id.ends_with(char::is_whitespace) {
        "starts or ends with white space"
    } else {
        return Ok(());
    };
    Err(Error::InvalidRunId {
        run_id: run_id.to_owned(),
        reason,
    })
}

/// Checks a step or event name: not empty, at most [`MAX_NAME_BYTES`], no control characters.
pub(crate) fn validate_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        Err("empty")
    } else if name.len() > MAX_NAME_BYTES {
        Err("longer than 256 bytes")
    } else if name.chars().any(char::is_control) {
        Err("contains control characters")
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{validate_run_id, validate_run_id_lookup};
    use crate::Error;

    /// The reason `validate` gives for `id`, or `None` if it takes it.
    fn refusal(validate: fn(&str) -> crate::Result<()>, id: &str) -> Option<&'static str> {
        match validate(id) {
            Ok(()) => None,
            Err(Error::InvalidRunId { run_id, reason }) => {
                assert_eq!(run_id, id);
                Some(reason)
            }
            Err(other) => panic!("{id:?}: expected InvalidRunId, got {other:?}"),
        }
    }

    #[test]
    fn new_run_ids_hold_no_bidirectional_controls_and_something_visible() {
        let bidi = "contains bidirectional control characters (Unicode Bidi_Control), which make text show in an order other than its own";
        let invisible =
            "holds only invisible characters (white space or Unicode format characters, Cf)";
        let dots = "is `.` or `..`, which a URL (the web UI's, the control endpoint's) reads as a step in its path, not as a run";
        for (id, reason) in [
            ("\u{202E}", bidi),
            ("deliver-\u{202E}1-tset", bidi),
            ("\u{2066}run\u{2069}", bidi),
            ("a\u{061C}b", bidi),
            ("a\u{200E}", bidi),
            ("\u{200F}a", bidi),
            ("\u{202A}a\u{202C}", bidi),
            ("\u{2067}x\u{2068}", bidi),
            ("\u{200B}", invisible),
            ("\u{00AD}", invisible),
            ("\u{FEFF}\u{2060}", invisible),
            ("\u{200B} \u{200D}", invisible),
            (".", dots),
            ("..", dots),
            // The rules before them come first.
            ("", "empty"),
            (" \u{202E}", "starts or ends with white space"),
            ("a\n\u{202E}", "contains control characters"),
        ] {
            assert_eq!(refusal(validate_run_id, id), Some(reason), "{id:?}");
        }
        // A joiner inside an emoji sequence, format characters beside visible ones, any script.
        for id in [
            "deploy-\u{1F469}\u{200D}\u{1F4BB}",
            "a\u{200D}b",
            "soft\u{00AD}hyphen",
            "\u{05E9}\u{05DC}\u{05D5}\u{05DD}-1",
            "r\u{00E9}sum\u{00E9}",
            "...",
            ".a",
        ] {
            assert_eq!(refusal(validate_run_id, id), None, "{id:?}");
        }
        let err = validate_run_id("\u{202E}1").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("invalid run id \"\\u{{202e}}1\": {bidi}")
        );
    }

    #[test]
    fn a_lookup_takes_the_ids_of_runs_stored_before_the_new_rules() {
        for id in ["\u{202E}", "a\u{2066}b", "\u{200B}", ".", ".."] {
            assert_eq!(refusal(validate_run_id_lookup, id), None, "{id:?}");
        }
        for (id, reason) in [
            ("", "empty"),
            ("a\tb", "contains control characters"),
            ("a ", "starts or ends with white space"),
            (&"x".repeat(257)[..], "longer than 256 bytes"),
        ] {
            assert_eq!(refusal(validate_run_id_lookup, id), Some(reason), "{id:?}");
        }
    }
}
