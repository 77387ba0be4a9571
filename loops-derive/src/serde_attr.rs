//! What the `#[serde(...)]` attributes say about the stored form, for the schema.
//!
//! Serde reports malformed serde attributes itself, so this parser never fails: what it does
//! not model is kept as text (a "note") and hashed as written, so that changing it still
//! changes the schema hash. Attributes that cannot change how stored data reads back
//! (`alias`, `bound`, `borrow`, `crate`, `expecting`, `deny_unknown_fields`, `getter`,
//! `remote`, `variant_identifier`, `field_identifier`) are ignored.

use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, Lit, LitStr, Type};

use crate::tokens::tokens_text;

/// Serde's case conversions for `rename_all`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl Rule {
    fn parse(s: &str) -> Option<Rule> {
        Some(match s {
            "lowercase" => Rule::Lower,
            "UPPERCASE" => Rule::Upper,
            "PascalCase" => Rule::Pascal,
            "camelCase" => Rule::Camel,
            "snake_case" => Rule::Snake,
            "SCREAMING_SNAKE_CASE" => Rule::ScreamingSnake,
            "kebab-case" => Rule::Kebab,
            "SCREAMING-KEBAB-CASE" => Rule::ScreamingKebab,
            _ => return None,
        })
    }

    /// A variant name (written in PascalCase) under this rule.
    pub(crate) fn variant(self, name: &str) -> String {
        let snake = || {
            let mut out = String::new();
            for (i, c) in name.chars().enumerate() {
                if i > 0 && c.is_uppercase() {
                    out.push('_');
                }
                out.push(c.to_ascii_lowercase());
            }
            out
        };
        match self {
            Rule::Pascal => name.to_owned(),
            Rule::Lower => name.to_ascii_lowercase(),
            Rule::Upper => name.to_ascii_uppercase(),
            Rule::Camel => lower_first(name),
            Rule::Snake => snake(),
            Rule::ScreamingSnake => snake().to_ascii_uppercase(),
            Rule::Kebab => snake().replace('_', "-"),
            Rule::ScreamingKebab => snake().to_ascii_uppercase().replace('_', "-"),
        }
    }

    /// A field name (written in snake_case) under this rule.
    pub(crate) fn field(self, name: &str) -> String {
        let pascal = || {
            let mut out = String::new();
            let mut upper = true;
            for c in name.chars() {
                if c == '_' {
                    upper = true;
                } else if upper {
                    out.push(c.to_ascii_uppercase());
                    upper = false;
                } else {
                    out.push(c);
                }
            }
            out
        };
        match self {
            Rule::Lower | Rule::Snake => name.to_owned(),
            Rule::Upper | Rule::ScreamingSnake => name.to_ascii_uppercase(),
            Rule::Pascal => pascal(),
            Rule::Camel => lower_first(&pascal()),
            Rule::Kebab => name.replace('_', "-"),
            Rule::ScreamingKebab => name.to_ascii_uppercase().replace('_', "-"),
        }
    }
}

fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// The attributes of a struct or enum (a container).
#[derive(Default)]
pub(crate) struct Container {
    pub rename: Option<String>,
    pub rename_all: Option<Rule>,
    pub rename_all_fields: Option<Rule>,
    pub tag: Option<String>,
    pub content: Option<String>,
    pub untagged: bool,
    /// `rename_all(serialize = .., deserialize = ..)` with two rules (or one of them): names
    /// written one way and read another.
    pub split_rename_all: bool,
    pub transparent: bool,
    pub default: bool,
    /// `into`, else `from` or `try_from`: the type the value is stored as.
    pub stored_as: Option<Type>,
    pub notes: Vec<String>,
}

/// The attributes of a variant.
#[derive(Default)]
pub(crate) struct Variant {
    pub rename: Option<String>,
    pub rename_all: Option<Rule>,
    pub skip: bool,
    /// `with`, or `serialize_with`/`deserialize_with`: the variant's data is opaque.
    pub with: Option<String>,
    /// The other names it is read under: `rename(deserialize = ..)`, `alias`.
    pub read_as: Vec<String>,
    /// `untagged` (read from its data alone, under no name) or `other` (read under any name
    /// no other variant has).
    pub untagged: bool,
    /// `rename(serialize = .., deserialize = ..)` with two names (or one of them): written
    /// under one name and read under another.
    pub split_rename: bool,
    pub notes: Vec<String>,
}

/// The attributes of a field.
#[derive(Default)]
pub(crate) struct Field {
    pub rename: Option<String>,
    pub skip_serializing: bool,
    pub skip_deserializing: bool,
    pub skip_serializing_if: bool,
    pub default: bool,
    pub flatten: bool,
    /// `with`, or `serialize_with`/`deserialize_with`: the field's stored form is opaque.
    pub with: Option<String>,
    pub notes: Vec<String>,
}

impl Field {
    /// `#[serde(skip)]`, or skipped both ways: not part of the stored form.
    pub(crate) fn skipped(&self) -> bool {
        self.skip_serializing && self.skip_deserializing
    }
}

const IGNORED: &[&str] = &[
    "alias",
    "bound",
    "borrow",
    "crate",
    "expecting",
    "deny_unknown_fields",
    "getter",
    "remote",
    "variant_identifier",
    "field_identifier",
];

/// Walks every `key` of every `#[serde(...)]` in `attrs`; `f` returns `Ok(false)` for a key
/// it does not model, which then becomes a note.
fn each(
    attrs: &[Attribute],
    notes: &mut Vec<String>,
    mut f: impl FnMut(&str, &ParseNestedMeta) -> syn::Result<bool>,
) {
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let parsed = attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            if IGNORED.contains(&key.as_str()) {
                skip_value(&meta)?;
                return Ok(());
            }
            if f(&key, &meta)? {
                return Ok(());
            }
            // Not modeled: keep the key and its value as written.
            let key_text = tokens_text(meta.path.to_token_stream());
            let value_text = if meta.input.peek(syn::Token![=]) {
                let value: Expr = meta.value()?.parse()?;
                format!(" = {}", tokens_text(value.to_token_stream()))
            } else if meta.input.peek(syn::token::Paren) {
                let group: proc_macro2::TokenTree = meta.input.parse()?;
                tokens_text(group.into_token_stream())
            } else {
                String::new()
            };
            notes.push(format!("{key_text}{value_text}"));
            Ok(())
        });
        if parsed.is_err() {
            // Malformed: serde reports it. Hash the whole attribute so that it still counts.
            notes.push(tokens_text(attr.meta.to_token_stream()));
        }
    }
}

/// Consumes `= value` or `(...)` after a key.
fn skip_value(meta: &ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.step(|cursor| match cursor.token_tree() {
            Some((_, rest)) => Ok(((), rest)),
            None => Err(cursor.error("expected a value")),
        })?;
    }
    Ok(())
}

fn lit(meta: &ParseNestedMeta) -> syn::Result<LitStr> {
    let expr: Expr = meta.value()?.parse()?;
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(other, "expected a string")),
    }
}

fn string(meta: &ParseNestedMeta) -> syn::Result<String> {
    lit(meta).map(|s| s.value())
}

/// `key = "a"`, or `key(serialize = "a", deserialize = "b")`: the serialize value, and the
/// deserialize one if it differs.
fn ser_de(meta: &ParseNestedMeta) -> syn::Result<(Option<String>, Option<String>)> {
    if meta.input.peek(syn::Token![=]) {
        let s = string(meta)?;
        return Ok((Some(s.clone()), Some(s)));
    }
    let (mut ser, mut de) = (None, None);
    meta.parse_nested_meta(|inner| {
        if inner.path.is_ident("serialize") {
            ser = Some(string(&inner)?);
        } else if inner.path.is_ident("deserialize") {
            de = Some(string(&inner)?);
        } else {
            skip_value(&inner)?;
        }
        Ok(())
    })?;
    Ok((ser, de))
}

/// A name from `rename`, noting a deserialize name that differs from the serialize one.
fn rename(meta: &ParseNestedMeta, notes: &mut Vec<String>) -> syn::Result<Option<String>> {
    let (ser, de) = ser_de(meta)?;
    Ok(split_name(ser, de, notes))
}

/// The serialize name of `rename`'s `ser` and `de`, noting a deserialize name that differs.
fn split_name(ser: Option<String>, de: Option<String>, notes: &mut Vec<String>) -> Option<String> {
    if let Some(de) = &de
        && ser.as_ref() != Some(de)
    {
        notes.push(format!("rename(deserialize = {de:?})"));
    }
    ser
}

fn rule(meta: &ParseNestedMeta, notes: &mut Vec<String>, key: &str) -> syn::Result<Option<Rule>> {
    let (ser, de) = ser_de(meta)?;
    Ok(split_rule(ser, de, notes, key))
}

/// The serialize rule of `key`'s `ser` and `de`, noting a deserialize rule that differs.
fn split_rule(
    ser: Option<String>,
    de: Option<String>,
    notes: &mut Vec<String>,
    key: &str,
) -> Option<Rule> {
    if let Some(de) = &de
        && ser.as_ref() != Some(de)
    {
        notes.push(format!("{key}(deserialize = {de:?})"));
    }
    ser.as_deref().and_then(Rule::parse)
}

fn flag(meta: &ParseNestedMeta) -> syn::Result<bool> {
    skip_value(meta)?;
    Ok(true)
}

pub(crate) fn container(attrs: &[Attribute]) -> Container {
    let mut c = Container::default();
    let mut notes = Vec::new();
    let mut extra = Vec::new();
    let mut from = None;
    each(attrs, &mut notes, |key, meta| {
        match key {
            "rename" => c.rename = rename(meta, &mut extra)?,
            "rename_all" => {
                let (ser, de) = ser_de(meta)?;
                c.split_rename_all = ser != de;
                c.rename_all = split_rule(ser, de, &mut extra, key);
            }
            "rename_all_fields" => c.rename_all_fields = rule(meta, &mut extra, key)?,
            "tag" => c.tag = Some(string(meta)?),
            "content" => c.content = Some(string(meta)?),
            "untagged" => c.untagged = flag(meta)?,
            "transparent" => c.transparent = flag(meta)?,
            "default" => c.default = flag(meta)?,
            "into" => c.stored_as = Some(lit(meta)?.parse::<Type>()?),
            "from" | "try_from" => from = Some(lit(meta)?.parse::<Type>()?),
            _ => return Ok(false),
        }
        Ok(true)
    });
    if c.stored_as.is_none() {
        c.stored_as = from;
    }
    c.notes = notes.into_iter().chain(extra).collect();
    c
}

pub(crate) fn variant(attrs: &[Attribute]) -> Variant {
    let mut v = Variant::default();
    let mut notes = Vec::new();
    let mut extra = Vec::new();
    let (mut ser_with, mut de_with) = (None, None);
    each(attrs, &mut notes, |key, meta| {
        match key {
            "rename" => {
                let (ser, de) = ser_de(meta)?;
                v.split_rename = ser != de;
                v.rename = split_name(ser, de, &mut extra);
            }
            "rename_all" => v.rename_all = rule(meta, &mut extra, key)?,
            "skip" | "skip_serializing" | "skip_deserializing" => v.skip = flag(meta)?,
            "with" => v.with = Some(string(meta)?),
            "serialize_with" => ser_with = Some(string(meta)?),
            "deserialize_with" => de_with = Some(string(meta)?),
            _ => return Ok(false),
        }
        Ok(true)
    });
    v.with = v.with.or_else(|| split_with(ser_with, de_with));
    v.notes = notes.into_iter().chain(extra).collect();
    // Kept as notes (they count in the schema hash as written); read here for the names.
    for note in &v.notes {
        // `other`: read for any name no variant has, as is `untagged` for any data.
        if note == "untagged" || note == "other" {
            v.untagged = true;
        }
        let de = note.strip_prefix("rename(deserialize = ");
        if let Some(lit) = de.and_then(|n| n.strip_suffix(')')) {
            v.read_as
                .extend(syn::parse_str::<LitStr>(lit).ok().map(|lit| lit.value()));
        }
    }
    v.read_as.extend(aliases(attrs));
    v
}

/// The names of `#[serde(alias = "..")]` in `attrs` (not in the schema hash: an alias
/// changes no stored form, but it is a name the variant is read under).
fn aliases(attrs: &[Attribute]) -> Vec<String> {
    let mut names = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        // Malformed: serde reports it.
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("alias") {
                names.push(string(&meta)?);
            } else {
                skip_value(&meta)?;
            }
            Ok(())
        });
    }
    names
}

pub(crate) fn field(attrs: &[Attribute]) -> Field {
    let mut f = Field::default();
    let mut notes = Vec::new();
    let mut extra = Vec::new();
    let (mut ser_with, mut de_with) = (None, None);
    each(attrs, &mut notes, |key, meta| {
        match key {
            "rename" => f.rename = rename(meta, &mut extra)?,
            "skip" => {
                f.skip_serializing = flag(meta)?;
                f.skip_deserializing = true;
            }
            "skip_serializing" => f.skip_serializing = flag(meta)?,
            "skip_deserializing" => f.skip_deserializing = flag(meta)?,
            "skip_serializing_if" => f.skip_serializing_if = flag(meta)?,
            "default" => f.default = flag(meta)?,
            "flatten" => f.flatten = flag(meta)?,
            "with" => f.with = Some(string(meta)?),
            "serialize_with" => ser_with = Some(string(meta)?),
            "deserialize_with" => de_with = Some(string(meta)?),
            _ => return Ok(false),
        }
        Ok(true)
    });
    f.with = f.with.or_else(|| split_with(ser_with, de_with));
    f.notes = notes.into_iter().chain(extra).collect();
    f
}

fn split_with(ser: Option<String>, de: Option<String>) -> Option<String> {
    match (ser, de) {
        (None, None) => None,
        (ser, de) => Some(format!(
            "{} / {}",
            ser.as_deref().unwrap_or("Serialize"),
            de.as_deref().unwrap_or("Deserialize")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn rename_rules_follow_serde() {
        assert_eq!(Rule::Snake.variant("PrOpened"), "pr_opened");
        assert_eq!(Rule::ScreamingKebab.variant("PrOpened"), "PR-OPENED");
        assert_eq!(Rule::Camel.variant("PrOpened"), "prOpened");
        assert_eq!(Rule::Lower.variant("PrOpened"), "propened");
        assert_eq!(Rule::Camel.field("pull_request_url"), "pullRequestUrl");
        assert_eq!(Rule::Pascal.field("pull_request_url"), "PullRequestUrl");
        assert_eq!(Rule::Kebab.field("pull_request_url"), "pull-request-url");
        assert_eq!(Rule::ScreamingSnake.field("url"), "URL");
    }

    #[test]
    fn attributes_are_read_and_the_rest_noted() {
        let attrs: Vec<Attribute> = vec![
            parse_quote!(#[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]),
            parse_quote!(#[serde(alias = "old", with = "my::codec", other_thing(a = 1))]),
        ];
        let f = field(&attrs);
        assert_eq!(f.rename.as_deref(), Some("n"));
        assert!(f.default && f.skip_serializing_if && !f.skipped());
        assert_eq!(f.with.as_deref(), Some("my::codec"));
        assert_eq!(f.notes, ["other_thing(a = 1)"]);

        let attrs: Vec<Attribute> = vec![parse_quote!(
            #[serde(tag = "type", content = "c", rename_all = "snake_case", into = "String")]
        )];
        let c = container(&attrs);
        assert_eq!(c.tag.as_deref(), Some("type"));
        assert_eq!(c.content.as_deref(), Some("c"));
        assert!(c.rename_all == Some(Rule::Snake));
        assert!(c.stored_as.is_some() && c.notes.is_empty());
    }
}
