//! Tokens as text, for the descriptions of types and attributes the derive writes.

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// Tokens as normalized text: `Vec<Option<String>>`, `&'static str`, `[u8; 4]`,
/// `HashMap<String, u64>`, whatever the spacing in the source.
pub(crate) fn tokens_text(tokens: TokenStream) -> String {
    let mut out = String::new();
    write_tokens(tokens, &mut out);
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
                    && punct.spacing() == proc_macro2::Spacing::Joint
                    && matches!(tokens.peek(), Some(TokenTree::Punct(p)) if p.as_char() == '>');
                if arrow {
                    tokens.next();
                    out.push_str(" -> ");
                } else {
                    match c {
                        ',' | ';' => {
                            out.push(c);
                            out.push(' ');
                        }
                        '+' | '=' => {
                            out.push(' ');
                            out.push(c);
                            out.push(' ');
                        }
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
