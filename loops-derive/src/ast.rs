//! The input as a typed model: the enum, its states and their fields, borrowing the syn nodes
//! so that every later error can point at what the user wrote.

use proc_macro2::Span;
use quote::format_ident;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, Path, Type, Visibility};

use crate::attr::{self, SchemaAttrs, StateAttrs, WorkflowAttrs};
use crate::case::snake_case;
use crate::ctxt::Errors;
use crate::serde_attr;

/// An enum deriving `Workflow`.
pub(crate) struct Workflow<'a> {
    pub original: &'a DeriveInput,
    pub ident: &'a Ident,
    pub vis: &'a Visibility,
    pub attrs: WorkflowAttrs,
    /// The path generated code names loops' items through: `{crate}::__private`, where
    /// `crate` is `#[workflow(crate = ...)]`, else `::loops` (see `CratePath::items`).
    pub krate: Path,
    pub serde: serde_attr::Container,
    pub states: Vec<State<'a>>,
    /// `{Enum}State`.
    pub state_ident: Ident,
    /// `{Enum}Handler`.
    pub handler_ident: Ident,
}

/// One variant: a state.
pub(crate) struct State<'a> {
    pub ident: &'a Ident,
    pub attrs: StateAttrs<'a>,
    pub serde: serde_attr::Variant,
    pub docs: Vec<&'a Attribute>,
    pub style: Style,
    pub fields: Vec<Field<'a>>,
    /// The handler method: the variant's name in snake case.
    pub method: Ident,
    /// `{Variant}Next`, or `{prefix}{Variant}Next` with `next_prefix`.
    pub next_ident: Ident,
    /// The `#[next(...)]` targets resolved to indices into `Workflow::states`, in the order
    /// written, without unknown names and repeats (`valid` reports those).
    pub next: Vec<usize>,
}

/// How a variant's fields are written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    Struct,
    Tuple,
    Unit,
}

/// One field of a state (or, for `#[derive(Schema)]`, of a struct or variant).
pub(crate) struct Field<'a> {
    /// The field's name, or `None` in a tuple variant.
    pub ident: Option<&'a Ident>,
    pub ty: &'a Type,
    pub docs: Vec<&'a Attribute>,
    /// The handler argument that receives this field: its name, or `field{index}`.
    pub arg: Ident,
    /// What `#[serde(...)]` says about how it is stored.
    pub serde: serde_attr::Field,
    /// `#[schema(...)]`.
    pub schema: SchemaAttrs,
}

impl<'a> Field<'a> {
    /// The fields of a struct or variant.
    pub(crate) fn all(cx: &Errors, fields: &'a Fields) -> Vec<Self> {
        fields
            .iter()
            .enumerate()
            .map(|(index, field)| Field {
                ident: field.ident.as_ref(),
                ty: &field.ty,
                docs: attr::docs(&field.attrs),
                arg: match &field.ident {
                    Some(ident) => ident.clone(),
                    None => format_ident!("field{}", index),
                },
                serde: serde_attr::field(&field.attrs),
                schema: attr::field(cx, &field.attrs),
            })
            .collect()
    }
}

impl Style {
    pub(crate) fn of(fields: &Fields) -> Self {
        match fields {
            Fields::Named(_) => Style::Struct,
            Fields::Unnamed(_) => Style::Tuple,
            Fields::Unit => Style::Unit,
        }
    }
}

impl<'a> Workflow<'a> {
    /// Models `input`; `None` if it is not an enum (reported to `cx`).
    pub(crate) fn from_syn(cx: &Errors, input: &'a DeriveInput) -> Option<Self> {
        let data = match &input.data {
            Data::Enum(data) => data,
            Data::Struct(data) => {
                cx.spanned(
                    data.struct_token,
                    "`#[derive(Workflow)]` needs an enum: one variant per state",
                );
                return None;
            }
            Data::Union(data) => {
                cx.spanned(
                    data.union_token,
                    "`#[derive(Workflow)]` needs an enum: one variant per state",
                );
                return None;
            }
        };
        let attrs = attr::workflow(cx, &input.attrs);
        let mut states: Vec<State<'a>> = data
            .variants
            .iter()
            .map(|variant| State::from_syn(cx, variant))
            .collect();
        let targets: Vec<Vec<usize>> = states
            .iter()
            .map(|state| {
                let mut resolved = Vec::new();
                for target in state.attrs.next.iter().flat_map(|n| &n.targets) {
                    if let Some(i) = states.iter().position(|s| s.ident == target)
                        && !resolved.contains(&i)
                    {
                        resolved.push(i);
                    }
                }
                resolved
            })
            .collect();
        for (state, next) in states.iter_mut().zip(targets) {
            state.next = next;
            if let Some(prefix) = &attrs.next_prefix {
                state.next_ident = format_ident!("{}{}Next", prefix, state.ident);
            }
        }
        let ident = &input.ident;
        Some(Workflow {
            original: input,
            ident,
            vis: &input.vis,
            krate: attrs.krate.items(),
            attrs,
            serde: serde_attr::container(&input.attrs),
            states,
            // Spanned at the enum's name: "defined here" notes point at it.
            state_ident: format_ident!("{}State", ident, span = ident.span()),
            handler_ident: format_ident!("{}Handler", ident, span = ident.span()),
        })
    }

    /// Whether the enum has generic parameters (not supported).
    pub(crate) fn is_generic(&self) -> bool {
        let generics = &self.original.generics;
        !generics.params.is_empty() || generics.where_clause.is_some()
    }

    /// The index of the initial state: the first `#[initial]` variant, else the first
    /// variant (a fallback for code generation after an error).
    pub(crate) fn initial(&self) -> Option<usize> {
        self.states
            .iter()
            .position(|s| s.attrs.initial.is_some())
            .or(if self.states.is_empty() {
                None
            } else {
                Some(0)
            })
    }
}

impl<'a> State<'a> {
    fn from_syn(cx: &Errors, variant: &'a syn::Variant) -> Self {
        let attrs = attr::state(cx, &variant.attrs);
        let style = Style::of(&variant.fields);
        let fields = Field::all(cx, &variant.fields);
        State {
            serde: serde_attr::variant(&variant.attrs),
            ident: &variant.ident,
            docs: attr::docs(&variant.attrs),
            style,
            fields,
            method: method_ident(&variant.ident),
            next_ident: format_ident!("{}Next", variant.ident),
            next: Vec::new(),
            attrs,
        }
    }

    /// Whether the state ends runs (it has no handler).
    pub(crate) fn is_terminal(&self) -> bool {
        self.attrs.terminal.is_some()
    }

    /// The span generated `{V}Next` enums use: the `#[next(...)]` attribute, else the variant.
    pub(crate) fn next_span(&self) -> Span {
        self.attrs
            .next
            .as_ref()
            .map_or_else(|| self.ident.span(), |n| n.span)
    }
}

/// The handler method for a variant: snake case, raw if it is a keyword (`Match` ->
/// `r#match`), with a trailing `_` for the keywords that cannot be raw (`Self_`, `Super`).
fn method_ident(variant: &Ident) -> Ident {
    let name = snake_case(&variant.to_string());
    let span = variant.span();
    if syn::parse_str::<Ident>(&name).is_ok() {
        Ident::new(&name, span)
    } else if matches!(name.as_str(), "self" | "super" | "crate" | "_") {
        Ident::new(&format!("{name}_"), span)
    } else {
        Ident::new_raw(&name, span)
    }
}
