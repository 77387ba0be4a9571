//! Name conversions: variant names to method names, and "did you mean" suggestions.

/// `PrOpened` -> `pr_opened`, `HTTPRequest` -> `http_request`, `Retry2` -> `retry2`.
pub(crate) fn snake_case(name: &str) -> String {
    let name = name.strip_prefix("r#").unwrap_or(name);
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            continue;
        }
        if c.is_uppercase() && i > 0 && !out.is_empty() && !out.ends_with('_') {
            let prev = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_uppercase() && next_is_lower)
            {
                out.push('_');
            }
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// The candidate closest to `name`, if one is close enough to be a likely typo.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let lower = name.to_lowercase();
    candidates
        .into_iter()
        .map(|c| {
            let d = if c.to_lowercase() == lower {
                0
            } else {
                distance(&lower, &c.to_lowercase())
            };
            (d, c)
        })
        // A third of the longer name's length: short names are suggested only when they differ
        // in case (`C` is no typo of `A`).
        .filter(|&(d, c)| d <= c.chars().count().max(name.chars().count()) / 3)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, in characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake() {
        assert_eq!(snake_case("PrOpened"), "pr_opened");
        assert_eq!(snake_case("Received"), "received");
        assert_eq!(snake_case("HTTPRequest"), "http_request");
        assert_eq!(snake_case("Retry2"), "retry2");
        assert_eq!(snake_case("Step2Done"), "step2_done");
        assert_eq!(snake_case("Pr_Opened"), "pr_opened");
        assert_eq!(snake_case("A"), "a");
        assert_eq!(snake_case("ABC"), "abc");
    }

    #[test]
    fn suggestions() {
        let states = ["Received", "Planned", "Edited", "PrOpened"];
        assert_eq!(closest("Edtied", states), Some("Edited"));
        assert_eq!(closest("planned", states), Some("Planned"));
        assert_eq!(closest("Merged", states), None);
        assert_eq!(closest("C", ["A", "B"]), None);
        assert_eq!(closest("a", ["A", "B"]), Some("A"));
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
