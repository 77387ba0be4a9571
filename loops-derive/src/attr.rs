//! The typed model of the derive's attributes: `#[workflow(...)]` on the enum, `#[initial]`,
//! `#[terminal]` and `#[next(...)]` on variants, `#[schema(...)]` on fields and on a type
//! deriving `Schema`. Parsing reports syntax mistakes (unknown, duplicate or malformed keys,
//! attributes in the wrong place); what the values mean is checked in `valid`.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Ident, Lit, LitStr, Meta, Path, Token, Type};

use crate::ctxt::Errors;

/// `#[workflow(name = "...", version = N, accepts = ["..."], crate = path)]`, possibly split
/// over several attributes.
#[derive(Default)]
pub(crate) struct WorkflowAttrs {
    pub name: Option<LitStr>,
    pub version: Option<(u32, Span)>,
    /// The stored schema hashes this version accepts (`accepts = ["5a1f..."]`), parsed, in
    /// the order written; `None` if the key is absent.
    pub accepts: Option<Vec<u64>>,
    pub krate: CratePath,
    /// `next_prefix = "Duo"`: the generated `{V}Next` enums are named `{prefix}{V}Next`, so
    /// that two workflows in one module may have a state of the same name.
    pub next_prefix: Option<Ident>,
    /// `#[event(name: Type, ...)]`: the events the workflow's states wait for, with their
    /// payload types, in the order written (duplicates included: `valid` reports them).
    pub events: Vec<EventDecl>,
}

/// One `name: Type` of `#[event(...)]`.
pub(crate) struct EventDecl {
    pub name: Ident,
    pub ty: Type,
}

impl syn::parse::Parse for EventDecl {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty: Type = input.parse()?;
        Ok(EventDecl { name, ty })
    }
}

/// `crate = path` in `#[workflow(...)]` or in `#[schema(...)]` on a type: the path through
/// which the generated code names loops' items (`path::Workflow`, `path::schema::Shape`, ...),
/// for crates that reach loops under another name (loops-core's own tests: `crate = crate`).
#[derive(Default)]
pub(crate) enum CratePath {
    /// Not given: `::loops`, the facade crate.
    #[default]
    Default,
    /// As written (a string's contents parsed as a path, spanned at the string).
    Given(Path),
    /// Given but malformed (reported): code naming loops could not resolve, so after this
    /// error the derive emits no fallback items, only the errors.
    Invalid,
}

impl CratePath {
    /// The path to loops as the user names it: `::loops`, or the path given.
    pub(crate) fn root(&self) -> Path {
        match self {
            CratePath::Given(path) => path.clone(),
            CratePath::Default | CratePath::Invalid => syn::parse_quote!(::loops),
        }
    }

    /// The path generated code names loops' items through: `{root}::__private`, with
    /// `__private` spanned at the end of the user's path. A path that is not loops then fails
    /// to resolve at that one segment, and the compiler reports the identical errors of every
    /// use once, at the user's path, not a dozen times at the derive.
    pub(crate) fn items(&self) -> Path {
        let mut path = self.root();
        let span = path
            .segments
            .last()
            .map_or_else(Span::call_site, |s| s.ident.span());
        path.segments.push(Ident::new("__private", span).into());
        path
    }

    pub(crate) fn is_invalid(&self) -> bool {
        matches!(self, CratePath::Invalid)
    }
}

/// The attributes of one variant.
#[derive(Default)]
pub(crate) struct StateAttrs<'a> {
    pub initial: Option<&'a Attribute>,
    pub terminal: Option<&'a Attribute>,
    pub next: Option<Next<'a>>,
}

/// `#[next(A, B)]`.
pub(crate) struct Next<'a> {
    pub original: &'a Attribute,
    /// The span of `[next(...)]`: generated `{V}Next` enums are spanned here, so that the
    /// compiler's "no variant named ..." points at the list of allowed states.
    pub span: Span,
    /// The states as written, in order (duplicates and unknown names included: `valid`
    /// reports them).
    pub targets: Vec<Ident>,
    /// Whether the attribute had a syntax error (already reported): `valid` then skips the
    /// checks that would only repeat it.
    pub malformed: bool,
}

/// `#[schema(as = Type, recursive = Name)]` on a field.
#[derive(Default)]
pub(crate) struct SchemaAttrs {
    /// Describe the field as this type (for types without a `Schema` impl).
    pub as_type: Option<Type>,
    /// Types named in the field that refer back to an enclosing type (mutual recursion).
    pub recursive: Vec<Ident>,
}

/// Where an attribute was found, for "belongs on ..." errors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Struct,
    Enum,
    Variant,
    Field,
}

const WORKFLOW: &str = "workflow";
const INITIAL: &str = "initial";
const TERMINAL: &str = "terminal";
const NEXT: &str = "next";
const SCHEMA: &str = "schema";
const CRATE: &str = "crate";
const EVENT: &str = "event";

fn is_ours(attr: &Attribute) -> Option<&'static str> {
    [WORKFLOW, INITIAL, TERMINAL, NEXT, SCHEMA, EVENT]
        .into_iter()
        .find(|name| attr.path().is_ident(name))
}

/// Reports an attribute of ours used where it means nothing.
fn misplaced(cx: &Errors, attr: &Attribute, name: &str, place: Place) {
    let what = match place {
        Place::Struct => "the struct",
        Place::Enum => "the enum",
        Place::Variant => "a variant",
        Place::Field => "a field",
    };
    let message = if name == WORKFLOW {
        format!("`#[workflow(...)]` belongs on the enum, not on {what}")
    } else if name == EVENT {
        format!("`#[event(name: Type)]` belongs on the workflow enum, not on {what}")
    } else if name == SCHEMA {
        format!("`#[schema(...)]` belongs on a field, not on {what}")
    } else {
        format!("`#[{name}]` belongs on a variant (a state), not on {what}")
    };
    cx.spanned(attr, message);
}

/// The doc comments (`#[doc = "..."]`) among `attrs`.
pub(crate) fn docs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs.iter().filter(|a| a.path().is_ident("doc")).collect()
}

/// Parses the enum's attributes.
pub(crate) fn workflow(cx: &Errors, attrs: &[Attribute]) -> WorkflowAttrs {
    let mut out = WorkflowAttrs::default();
    for attr in attrs {
        match is_ours(attr) {
            Some(WORKFLOW) => parse_workflow(cx, attr, &mut out),
            Some(EVENT) => parse_events(cx, attr, &mut out.events),
            Some(other) => misplaced(cx, attr, other, Place::Enum),
            None => {}
        }
    }
    out
}

/// The form of `next_prefix`, for its errors.
const NEXT_PREFIX_FORM: &str = "expected `next_prefix = \"Name\"`, a string that starts a type name: the generated enums are then named `{Name}{State}Next`";

fn parse_workflow(cx: &Errors, attr: &Attribute, out: &mut WorkflowAttrs) {
    if !matches!(attr.meta, Meta::List(_)) {
        cx.spanned(attr, "expected `#[workflow(name = \"...\", version = N)]`");
        return;
    }
    let result = attr.parse_nested_meta(|meta| {
        if meta.path.is_ident(CRATE) {
            return parse_crate(cx, &meta, WORKFLOW, &mut out.krate);
        }
        let key = meta.path.clone();
        let value = if meta.input.peek(Token![=]) {
            Some(meta.value()?.parse::<Expr>()?)
        } else {
            None
        };
        if key.is_ident("name") {
            let Some(value) = value else {
                cx.spanned(&key, "expected `name = \"...\"`");
                return Ok(());
            };
            let Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) = value
            else {
                cx.spanned(&value, "`name` must be a string literal: `name = \"...\"`");
                return Ok(());
            };
            if out.name.is_some() {
                cx.spanned(&key, "duplicate `name` in `#[workflow(...)]`");
            } else {
                out.name = Some(lit);
            }
        } else if key.is_ident("version") {
            let Some(value) = value else {
                cx.spanned(&key, "expected `version = N`");
                return Ok(());
            };
            let Some(version) = version_of(cx, &value) else {
                return Ok(());
            };
            if out.version.is_some() {
                cx.spanned(&key, "duplicate `version` in `#[workflow(...)]`");
            } else {
                out.version = Some((version, value.span()));
            }
        } else if key.is_ident("next_prefix") {
            let Some(value) = value else {
                cx.spanned(&key, NEXT_PREFIX_FORM);
                return Ok(());
            };
            let Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) = &value
            else {
                cx.spanned(&value, NEXT_PREFIX_FORM);
                return Ok(());
            };
            // The prefix starts the names of types: `{prefix}{State}Next` must be one.
            let Ok(prefix) = syn::parse_str::<Ident>(&lit.value()) else {
                cx.spanned(lit, NEXT_PREFIX_FORM);
                return Ok(());
            };
            if out.next_prefix.is_some() {
                cx.spanned(&key, "duplicate `next_prefix` in `#[workflow(...)]`");
            } else {
                out.next_prefix = Some(Ident::new(&prefix.to_string(), lit.span()));
            }
        } else if key.is_ident("accepts") {
            let Some(value) = value else {
                cx.spanned(&key, ACCEPTS_FORM);
                skip_parenthesized(&meta);
                return Ok(());
            };
            let hashes = accepts_of(cx, &value);
            if out.accepts.is_some() {
                cx.spanned(&key, "duplicate `accepts` in `#[workflow(...)]`");
            } else {
                out.accepts = Some(hashes);
            }
        } else {
            if value.is_none() {
                skip_parenthesized(&meta);
            }
            cx.spanned(
                &key,
                format!(
                    "unknown key `{}` in `#[workflow(...)]`: expected `name`, `version`, `accepts`, `next_prefix` or `crate`",
                    path_text(&key)
                ),
            );
        }
        Ok(())
    });
    if let Err(error) = result {
        cx.push(error);
    }
}

/// Parses the value of `crate = path` into `slot`: a path, or a string holding one (as serde's
/// `#[serde(crate = "...")]` spells it). `attr` names the attribute, for messages.
fn parse_crate(
    cx: &Errors,
    meta: &ParseNestedMeta,
    attr: &str,
    slot: &mut CratePath,
) -> syn::Result<()> {
    let key = &meta.path;
    if !meta.input.peek(Token![=]) {
        cx.spanned(key, "expected `crate = path`, like `crate = loops_core`");
        skip_parenthesized(meta);
        *slot = CratePath::Invalid;
        return Ok(());
    }
    // Taken as tokens, so that anything that is not a path gets the message below rather than
    // an expression parser's.
    let value = value_tokens(meta)?;
    let path = match syn::parse2::<LitStr>(value.clone()) {
        Ok(lit) => lit.parse_with(Path::parse_mod_style),
        Err(_) => Path::parse_mod_style.parse2(value.clone()),
    };
    let Ok(path) = path else {
        let message = "`crate` must be the path to the loops crate, like `crate = loops_core` \
                       or `crate = \"loops_core\"`";
        if value.is_empty() {
            cx.spanned(key, message);
        } else {
            cx.spanned(&value, message);
        }
        *slot = CratePath::Invalid;
        return Ok(());
    };
    match slot {
        CratePath::Default => *slot = CratePath::Given(path),
        CratePath::Given(_) | CratePath::Invalid => {
            cx.spanned(key, format!("duplicate `crate` in `#[{attr}(...)]`"));
        }
    }
    Ok(())
}

/// The tokens of the value after `key =`, up to the next `,`.
fn value_tokens(meta: &ParseNestedMeta) -> syn::Result<TokenStream> {
    meta.value()?.step(|cursor| {
        let mut rest = *cursor;
        let mut tokens = TokenStream::new();
        while let Some((token, next)) = rest.token_tree() {
            if matches!(&token, TokenTree::Punct(p) if p.as_char() == ',') {
                break;
            }
            tokens.extend([token]);
            rest = next;
        }
        Ok((tokens, rest))
    })
}

/// Skips a parenthesized value after a key (`retries(3)`), so that the keys after it are still
/// checked.
fn skip_parenthesized(meta: &ParseNestedMeta) {
    if meta.input.peek(syn::token::Paren) {
        let _ = meta.input.step(|cursor| match cursor.token_tree() {
            Some((_, rest)) => Ok(((), rest)),
            None => Err(cursor.error("expected a value")),
        });
    }
}

const ACCEPTS_FORM: &str = "expected `accepts = [\"HASH\", ...]`, each HASH a stored schema hash of \
                            16 hex digits, as `loops schema` prints it";

/// The hashes of `accepts = ["...", ...]`: each a string of 16 hex digits, listed once.
/// Mistakes are reported, at the string; the valid hashes are returned.
fn accepts_of(cx: &Errors, value: &Expr) -> Vec<u64> {
    let Expr::Array(array) = ungrouped(value) else {
        cx.spanned(value, ACCEPTS_FORM);
        return Vec::new();
    };
    let mut out = Vec::new();
    for element in &array.elems {
        let Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) = ungrouped(element)
        else {
            cx.spanned(element, ACCEPTS_FORM);
            continue;
        };
        let text = lit.value();
        let hash = (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(&text, 16).ok())
            .flatten();
        match hash {
            None => cx.spanned(
                lit,
                format!(
                    "`{text}` is not a schema hash: expected 16 hex digits, as `loops schema` \
                     or the refusal of a run prints it"
                ),
            ),
            Some(hash) if out.contains(&hash) => {
                cx.spanned(lit, format!("schema `{text}` is listed twice in `accepts`"));
            }
            Some(hash) => out.push(hash),
        }
    }
    out
}

/// `expr` without the invisible groups a `macro_rules!` fragment (`$h:literal`, `$e:expr`)
/// is wrapped in: `accepts = [$h]` reads as the literal written in place.
fn ungrouped(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

fn version_of(cx: &Errors, value: &Expr) -> Option<u32> {
    let value = ungrouped(value);
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => match int.base10_parse::<u32>() {
            Ok(v) => Some(v),
            Err(_) => {
                cx.spanned(
                    int,
                    "`version` must be an integer from 0 to 4294967295 (a `u32`)",
                );
                None
            }
        },
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            cx.spanned(value, "`version` cannot be negative: it is a `u32`");
            None
        }
        _ => {
            cx.spanned(value, "`version` must be an integer, like `version = 2`");
            None
        }
    }
}

/// Parses a variant's attributes.
pub(crate) fn state<'a>(cx: &Errors, attrs: &'a [Attribute]) -> StateAttrs<'a> {
    let mut out = StateAttrs::default();
    for attr in attrs {
        match is_ours(attr) {
            Some(INITIAL) => flag(cx, attr, INITIAL, &mut out.initial),
            Some(TERMINAL) => flag(cx, attr, TERMINAL, &mut out.terminal),
            Some(NEXT) => {
                if let Some(next) = parse_next(cx, attr) {
                    if out.next.is_some() {
                        cx.spanned(
                            attr,
                            "duplicate `#[next(...)]`: list all the next states in one attribute",
                        );
                    } else {
                        out.next = Some(next);
                    }
                }
            }
            Some(other) => misplaced(cx, attr, other, Place::Variant),
            None => {}
        }
    }
    out
}

/// Parses a field's `#[schema(...)]`, and reports any other attribute of ours on it.
pub(crate) fn field(cx: &Errors, attrs: &[Attribute]) -> SchemaAttrs {
    let mut out = SchemaAttrs::default();
    for attr in attrs {
        match is_ours(attr) {
            Some(SCHEMA) => parse_schema(cx, attr, &mut out),
            Some(name) => misplaced(cx, attr, name, Place::Field),
            None => {}
        }
    }
    out
}

/// Reports `#[schema(...)]` on a variant (`#[derive(Schema)]`).
pub(crate) fn no_schema_attr(cx: &Errors, attrs: &[Attribute]) {
    for attr in attrs.iter().filter(|a| a.path().is_ident(SCHEMA)) {
        misplaced(cx, attr, SCHEMA, Place::Variant);
    }
}

/// Parses `#[schema(crate = path)]` on a struct or enum deriving `Schema` (`place`), and
/// reports the keys that belong on fields.
pub(crate) fn schema_container(cx: &Errors, attrs: &[Attribute], place: Place) -> CratePath {
    let mut krate = CratePath::Default;
    let what = if place == Place::Struct {
        "the struct"
    } else {
        "the enum"
    };
    for attr in attrs.iter().filter(|a| a.path().is_ident(SCHEMA)) {
        if !matches!(attr.meta, Meta::List(_)) {
            cx.spanned(
                attr,
                format!("expected `#[schema(crate = path)]` on {what}"),
            );
            continue;
        }
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident(CRATE) {
                return parse_crate(cx, &meta, SCHEMA, &mut krate);
            }
            let key = path_text(&meta.path);
            if meta.input.peek(Token![=]) {
                value_tokens(&meta)?;
            } else {
                skip_parenthesized(&meta);
            }
            let message = if key == "as" || key == "recursive" {
                format!("`{key}` belongs on a field, not on {what}")
            } else {
                format!("unknown key `{key}` in `#[schema(...)]` on {what}: expected `crate`")
            };
            cx.spanned(&meta.path, message);
            Ok(())
        });
        if let Err(error) = result {
            cx.push(error);
        }
    }
    krate
}

fn parse_schema(cx: &Errors, attr: &Attribute, out: &mut SchemaAttrs) {
    if !matches!(attr.meta, Meta::List(_)) {
        cx.spanned(
            attr,
            "expected `#[schema(as = Type)]` or `#[schema(recursive = Type)]`",
        );
        return;
    }
    let result = attr.parse_nested_meta(|meta| {
        if meta.path.is_ident("as") {
            let ty: Type = meta.value()?.parse()?;
            if out.as_type.is_some() {
                cx.spanned(&meta.path, "duplicate `as` in `#[schema(...)]`");
            } else {
                out.as_type = Some(ty);
            }
        } else if meta.path.is_ident("recursive") {
            let ident: Ident = meta.value()?.parse()?;
            out.recursive.push(ident);
        } else if meta.path.is_ident(CRATE) {
            if meta.input.peek(Token![=]) {
                value_tokens(&meta)?;
            }
            cx.spanned(
                &meta.path,
                "`crate` belongs on the type deriving `Schema`, not on a field (on a workflow: \
                 `#[workflow(crate = ...)]`)",
            );
        } else {
            if meta.input.peek(Token![=]) {
                meta.value()?.parse::<Expr>()?;
            }
            cx.spanned(
                &meta.path,
                format!(
                    "unknown key `{}` in `#[schema(...)]`: expected `as` or `recursive`",
                    path_text(&meta.path)
                ),
            );
        }
        Ok(())
    });
    if let Err(error) = result {
        cx.push(error);
    }
}

/// `#[event(approve: Approval, reject: Rejection)]`: appends the declarations to `out`.
fn parse_events(cx: &Errors, attr: &Attribute, out: &mut Vec<EventDecl>) {
    let Meta::List(list) = &attr.meta else {
        cx.spanned(
            attr,
            "expected the events and their payload types: `#[event(approve: Approval)]`",
        );
        return;
    };
    match list.parse_args_with(Punctuated::<EventDecl, Token![,]>::parse_terminated) {
        Ok(decls) if decls.is_empty() => cx.spanned(
            attr,
            "`#[event()]` declares nothing: write `#[event(approve: Approval)]`, or remove it",
        ),
        Ok(decls) => out.extend(decls),
        Err(error) => cx.push(error),
    }
}

fn flag<'a>(cx: &Errors, attr: &'a Attribute, name: &str, slot: &mut Option<&'a Attribute>) {
    if !matches!(attr.meta, Meta::Path(_)) {
        cx.spanned(attr, format!("`#[{name}]` takes no arguments"));
    }
    if slot.is_some() {
        cx.spanned(attr, format!("duplicate `#[{name}]`"));
    } else {
        *slot = Some(attr);
    }
}

fn parse_next<'a>(cx: &Errors, attr: &'a Attribute) -> Option<Next<'a>> {
    let mut next = Next {
        original: attr,
        span: attr.bracket_token.span.join(),
        targets: Vec::new(),
        malformed: false,
    };
    let Meta::List(list) = &attr.meta else {
        cx.spanned(
            attr,
            "expected the list of next states: `#[next(State, ...)]`",
        );
        next.malformed = true;
        return Some(next);
    };
    let paths = match list.parse_args_with(Punctuated::<Path, Token![,]>::parse_terminated) {
        Ok(paths) => paths,
        Err(error) => {
            cx.push(error);
            next.malformed = true;
            return Some(next);
        }
    };
    for path in paths {
        let Some(last) = path.segments.last() else {
            continue;
        };
        if path.get_ident().is_none() {
            cx.spanned(
                &path,
                format!("name the state alone, without a path: `{}`", last.ident),
            );
        }
        // `Deliver::Done` still counts as `Done`, so that nothing else is reported about it.
        next.targets.push(last.ident.clone());
    }
    Some(next)
}

fn path_text(path: &Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}
