//! Unicode's bidirectional controls: one set, for the rule of a new run's id
//! ([`validate_run_id`](crate::validate_run_id)) and for the text loops shows escaped (an
//! error's message, the CLI's output). A leaf module: it imports nothing of loops.

use std::borrow::Cow;

/// The characters of Unicode's property Bidi_Control (PropList.txt): U+061C ARABIC LETTER
/// MARK, U+200E LEFT-TO-RIGHT MARK, U+200F RIGHT-TO-LEFT MARK, U+202A to U+202E (the
/// embeddings, U+202C POP DIRECTIONAL FORMATTING and the overrides) and U+2066 to U+2069 (the
/// isolates). They change the order in which a terminal or a page shows the text around them
/// (the "Trojan Source" attack, CVE-2021-42574). The set has not changed since Unicode 6.3,
/// which added U+061C and the isolates.
const BIDI_CONTROLS: [char; 12] = [
    '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}',
    '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
];

/// Whether `c` is a bidirectional control character (Unicode's Bidi_Control: U+061C, U+200E,
/// U+200F, U+202A to U+202E, U+2066 to U+2069), which makes a terminal or a page show the
/// text around it in an order other than its own. New run ids may not hold one
/// ([`validate_run_id`](crate::validate_run_id)); text that may (an event's payload, a cancellation's reason, an
/// old run id) is shown with them escaped by the `loops` CLI.
pub fn is_bidi_control(c: char) -> bool {
    BIDI_CONTROLS.contains(&c)
}

/// `text` with each bidirectional control character ([`is_bidi_control`]) written as its
/// escape, `\u{202e}` (four hex digits at least): stored text (a payload, a cancellation's
/// reason, an old run id) shown in a message or on a terminal reads in its own order.
/// Borrowed when there is none.
pub fn escape_bidi_controls(text: &str) -> Cow<'_, str> {
    replace_bidi_controls(text, |c| format!("\\u{{{:04x}}}", u32::from(c)))
}

/// `text` with each bidirectional control character ([`is_bidi_control`]) replaced by what
/// `escape` returns for it: for an escape in another syntax than Rust's (JSON's `\u202e`, in
/// text that is JSON). Borrowed when there is none.
pub fn replace_bidi_controls(text: &str, escape: impl Fn(char) -> String) -> Cow<'_, str> {
    if !text.chars().any(is_bidi_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_bidi_control(c) {
            out.push_str(&escape(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_controls_are_escaped_with_four_digits() {
        assert_eq!(escape_bidi_controls("plain"), Cow::Borrowed("plain"));
        assert_eq!(
            escape_bidi_controls("a\u{202e}b\u{061c}"),
            "a\\u{202e}b\\u{061c}"
        );
        let json = |c: char| format!("\\u{:04x}", u32::from(c));
        assert_eq!(replace_bidi_controls("x\u{2066}", json), "x\\u2066");
        assert_eq!(replace_bidi_controls("x", json), Cow::Borrowed("x"));
    }
}
