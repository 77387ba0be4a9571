//! The schema constants: `SCHEMA`, a canonical text of the enum's stored shape, and
//! `SCHEMA_HASH`, its XXH3-64.

use std::fmt::Write as _;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;

use crate::ast::{Style, Workflow};
use crate::expand::workflow_name;

/// `const SCHEMA_HASH` and `const SCHEMA` of the `Workflow` impl.
pub(crate) fn consts(w: &Workflow) -> TokenStream {
    let text = text(w);
    let hash = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
    let hash = syn::LitInt::new(&format!("0x{hash:016x}"), proc_macro2::Span::call_site());
    quote! {
        const SCHEMA_HASH: ::loops::SchemaHash = ::loops::SchemaHash::from_u64(#hash);
        const SCHEMA: &'static str = #text;
    }
}

/// The canonical text: a header line, then one line per state in declaration order, e.g.
/// `Tested { issue: Issue, commit: String } -> Edited | PrOpened`. Doc comments, attributes
/// other than ours, and formatting do not appear in it.
pub(crate) fn text(w: &Workflow) -> String {
    let version = w.attrs.version.map_or(1, |(v, _)| v);
    let mut out = format!("workflow {} version {}\n", workflow_name(w), version);
    for state in &w.states {
        out.push_str(&state.ident.unraw().to_string());
        let fields: Vec<String> = state
            .fields
            .iter()
            .map(|f| match f.ident {
                Some(name) => format!("{}: {}", name.unraw(), type_text(f.ty)),
                None => type_text(f.ty),
            })
            .collect();
        match state.style {
            Style::Struct => {
                let _ = write!(out, " {{ {} }}", fields.join(", "));
            }
            Style::Tuple => {
                let _ = write!(out, "({})", fields.join(", "));
            }
            Style::Unit => {}
        }
        if !state.next.is_empty() {
            let next: Vec<String> = state
                .next
                .iter()
                .map(|&i| w.states[i].ident.unraw().to_string())
                .collect();
            let _ = write!(out, " -> {}", next.join(" | "));
        }
        if state.attrs.initial.is_some() {
            out.push_str(" (initial)");
        }
        if state.is_terminal() {
            out.push_str(" (terminal)");
        }
        out.push('\n');
    }
    out
}

/// A type as normalized token text: `Vec<Option<String>>`, `&'static str`, `[u8; 4]`,
/// `HashMap<String, u64>`, whatever the spacing in the source.
pub(crate) fn type_text(ty: &syn::Type) -> String {
    let mut out = String::new();
    write_tokens(ty.to_token_stream(), &mut out);
    out
}

fn write_tokens(tokens: TokenStream, out: &mut String) {
    let mut tokens = tokens.into_iter().peekable();
    while let Some(token) = tokens.next() {
        match token {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                write_tokens(group.stream(), out);
                out.push_str(close);
            }
            TokenTree::Punct(punct) => {
                let c = punct.as_char();
                let arrow = c == '-'
                    && punct.spacing() == Spacing::Joint
                    && matches!(tokens.peek(), Some(TokenTree::Punct(p)) if p.as_char() == '>');
                if arrow {
                    tokens.next();
                    out.push_str(" -> ");
                } else {
                    match c {
                        ',' | ';' => out.push_str(&format!("{c} ")),
                        '+' | '=' => out.push_str(&format!(" {c} ")),
                        _ => out.push(c),
                    }
                }
            }
            TokenTree::Ident(ident) => {
                word_gap(out);
                out.push_str(&ident.to_string());
            }
            TokenTree::Literal(literal) => {
                word_gap(out);
                out.push_str(&literal.to_string());
            }
        }
    }
}

/// A space between two words (`dyn Trait`, `'a str`), none after punctuation.
fn word_gap(out: &mut String) {
    if out.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
        out.push(' ');
    }
}
