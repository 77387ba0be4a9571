//! Code generation: the state enum, one `{V}Next` enum per non-terminal state, the handler
//! trait, and the `StateId`, `Workflow` and `Dispatch` impls.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned as _;
use syn::{Ident, Index, Member};

use crate::ast::{State, Style, Workflow};
use crate::shape::Shapes;
use crate::tokens::tokens_text;

/// The generated items of a valid workflow.
pub(crate) fn expand(w: &Workflow) -> TokenStream {
    let types = types(w);
    let (schema_items, schema_consts) = schema_consts(w);
    let impls = impls(w, dispatch_body(w), schema_consts);
    quote! {
        #types
        const _: () = {
            #schema_items
            #impls
        };
    }
}

/// The workflow's stored form as a `WorkflowShape` (with the items it needs), and the
/// `SCHEMA_HASH` and `SCHEMA` constants computed from it at compile time.
fn schema_consts(w: &Workflow) -> (TokenStream, TokenStream) {
    let krate = &w.krate;
    let mut shapes = Shapes::new(krate, None);
    let states: Vec<TokenStream> = w
        .states
        .iter()
        .map(|s| {
            let name = s.ident.unraw().to_string();
            let stored = s.serde.rename.clone().unwrap_or_else(|| {
                w.serde.rename_all.map_or(name.clone(), |r| r.variant(&name))
            });
            let fields = match &s.serde.with {
                Some(with) => crate::schema::opaque(krate, &s.fields, with),
                None => {
                    let rule = s.serde.rename_all.or(w.serde.rename_all_fields);
                    shapes.fields(s.style, &s.fields, rule, false)
                }
            };
            let mut notes = s.serde.notes.clone();
            if s.serde.skip {
                notes.push("skip".to_owned());
            }
            let note = notes.join(", ");
            let initial = s.attrs.initial.is_some();
            let terminal = s.is_terminal();
            let next = s.next.iter().map(|&i| w.states[i].ident.unraw().to_string());
            quote! {
                #krate::schema::StateShape {
                    name: #name,
                    variant: #krate::schema::Variant { name: #stored, fields: #fields, note: #note },
                    initial: #initial,
                    terminal: #terminal,
                    next: &[#(#next),*],
                }
            }
        })
        .collect();
    let name = workflow_name(w);
    let version = w.attrs.version.map_or(1, |(v, _)| v);
    let repr = crate::shape::repr(krate, &w.serde);
    let mut notes = w.serde.notes.clone();
    if let Some(ty) = &w.serde.stored_as {
        notes.push(format!("stored as {}", tokens_text(ty.to_token_stream())));
    }
    let note = notes.join(", ");
    let events: Vec<TokenStream> = w
        .attrs
        .events
        .iter()
        .map(|e| {
            let name = e.name.unraw().to_string();
            let payload = shapes.of_type(&e.ty, &[]);
            quote!(#krate::schema::EventShape { name: #name, payload: #payload })
        })
        .collect();
    let markers = shapes.markers();
    let items = quote! {
        #markers
        const __LOOPS_SHAPE: #krate::schema::WorkflowShape = #krate::schema::WorkflowShape {
            name: #name,
            version: #version,
            repr: #repr,
            states: &[#(#states),*],
            note: #note,
            events: &[#(#events),*],
        };
        const __LOOPS_SCHEMA_LEN: usize = #krate::describe_len(&__LOOPS_SHAPE);
        const __LOOPS_SCHEMA: [u8; __LOOPS_SCHEMA_LEN] =
            #krate::describe::<__LOOPS_SCHEMA_LEN>(&__LOOPS_SHAPE);
    };
    let consts = quote! {
        const SCHEMA_HASH: #krate::SchemaHash = __LOOPS_SHAPE.hash();
        const SCHEMA: &'static str = #krate::utf8(&__LOOPS_SCHEMA);
    };
    (items, consts)
}

/// The generated types: the state enum, the `{V}Next` enums and the handler trait. They cannot
/// fail to compile unless the user's own field types do, so the fallback emits them too.
pub(crate) fn types(w: &Workflow) -> TokenStream {
    let state_enum = state_enum(w);
    let next_enums = w
        .states
        .iter()
        .filter(|s| !s.is_terminal())
        .map(|s| next_enum(w, s));
    let handler = handler_trait(w);
    quote! {
        #state_enum
        #(#next_enums)*
        #handler
    }
}

/// The trait impls. `dispatch` is the body of `Dispatch::dispatch` and `schema` the
/// `SCHEMA_HASH` and `SCHEMA` constants: the fallback replaces both.
pub(crate) fn impls(w: &Workflow, dispatch: TokenStream, schema: TokenStream) -> TokenStream {
    let krate = &w.krate;
    let ident = w.ident;
    let state_ident = &w.state_ident;
    let handler = &w.handler_ident;
    let state_id = state_id_impl(w);
    let from_next = w
        .states
        .iter()
        .filter(|s| !s.is_terminal())
        .map(|s| from_next_impl(w, s));
    let name = workflow_name(w);
    let version = w.attrs.version.map_or(1, |(v, _)| v);
    let state_arms = w.states.iter().map(|s| {
        let v = s.ident;
        quote!(#ident::#v { .. } => #state_ident::#v)
    });
    let accepts = w.attrs.accepts.as_ref().map(|hashes| {
        quote! {
            const ACCEPTS: &'static [#krate::SchemaHash] =
                &[#(#krate::SchemaHash::from_u64(#hashes)),*];
        }
    });
    let events = event_consts(w);
    let read_event = read_event_fn(w);
    quote! {
        #state_id
        #(#from_next)*
        #events

        #[automatically_derived]
        impl #krate::Workflow for #ident {
            type State = #state_ident;
            const NAME: &'static str = #name;
            const VERSION: u32 = #version;
            #schema
            #accepts
            #read_event
            fn state(&self) -> #state_ident {
                match self {
                    #(#state_arms,)*
                }
            }
        }

        // The name as a type, for the compile-time check of `Migrate` impls.
        #[automatically_derived]
        impl #krate::Versioned for #ident {
            type Name = #krate::Named<{ #krate::SchemaHash::of(#name.as_bytes()).to_u64() }>;
        }

        #[automatically_derived]
        impl<__H: #handler + ?::core::marker::Sized> #krate::Dispatch<__H> for #ident {
            fn dispatch(
                self,
                __handler: &__H,
                __ctx: &#krate::Context,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<Self, #krate::BoxError>,
            > + ::core::marker::Send {
                #dispatch
            }
        }
    }
}

/// `Workflow::read_event` for a workflow that declares events: the payload of each read as
/// its declared type (`None` without events: the trait's default). Each arm is spanned at
/// its type, so a type that cannot be read from JSON is reported there.
fn read_event_fn(w: &Workflow) -> Option<TokenStream> {
    if w.attrs.events.is_empty() {
        return None;
    }
    let krate = &w.krate;
    // An event declared twice is reported by `valid`: one arm each.
    let mut seen: Vec<String> = Vec::new();
    let arms = w.attrs.events.iter().filter_map(|e| {
        let name = e.name.unraw().to_string();
        if seen.contains(&name) {
            return None;
        }
        seen.push(name.clone());
        let ty = &e.ty;
        Some(quote_spanned! {ty.span()=>
            #name => ::core::option::Option::Some(#krate::read_event_as::<#ty>(__payload)),
        })
    });
    Some(quote! {
        fn read_event(
            __event: &str,
            __payload: &str,
        ) -> ::core::option::Option<::core::result::Result<(), ::std::string::String>> {
            match __event {
                #(#arms)*
                _ => ::core::option::Option::None,
            }
        }
    })
}

/// One `loops::Event<Payload>` constant per declared event, on the workflow enum:
/// `Deliver::APPROVE` for `#[event(approve: Approval)]`. Spanned at the declaration, so a
/// payload type that does not exist is reported there.
fn event_consts(w: &Workflow) -> Option<TokenStream> {
    if w.attrs.events.is_empty() {
        return None;
    }
    let krate = &w.krate;
    let ident = w.ident;
    let vis = w.vis;
    // A constant name declared twice is reported by `valid`: only the first is generated,
    // so that the compiler does not report it again.
    let mut seen: Vec<String> = Vec::new();
    let consts = w.attrs.events.iter().filter_map(|e| {
        let name = e.name.unraw().to_string();
        let upper = crate::case::snake_case(&name).to_uppercase();
        if seen.contains(&upper) {
            return None;
        }
        seen.push(upper.clone());
        let constant = Ident::new(&upper, e.name.span());
        let ty = &e.ty;
        let doc = format!(
            "The event `{name}` of workflow `{}`, with a payload of type `{}` \
             (`#[event({name}: ...)]`): pass it to `Context::wait_for` and `Runtime::send` so \
             that the compiler checks the payload's type.",
            workflow_name(w),
            tokens_text(ty.to_token_stream()),
        );
        Some(quote_spanned! {e.name.span()=>
            #[doc = #doc]
            #[allow(dead_code)]
            #vis const #constant: #krate::Event<#ty> = #krate::Event::new(#name);
        })
    });
    Some(quote! {
        #[automatically_derived]
        impl #ident {
            #(#consts)*
        }
    })
}

/// The workflow's name: `#[workflow(name = "...")]`, else the enum's name in snake case.
pub(crate) fn workflow_name(w: &Workflow) -> String {
    match &w.attrs.name {
        Some(name) => name.value(),
        None => crate::case::snake_case(&w.ident.unraw().to_string()),
    }
}

fn state_enum(w: &Workflow) -> TokenStream {
    let vis = w.vis;
    let root = w.attrs.krate.root();
    let state_id = format!(
        " [`StateId`]: {}::StateId",
        tokens_text(root.to_token_stream())
    );
    let ident = w.ident;
    let state_ident = &w.state_ident;
    let doc = format!(
        " The states of [`{ident}`] without their data: what records store, queries filter \
         on and logs print.\n\n Generated by `#[derive(Workflow)]`; its [`StateId`] impl \
         carries the transition table."
    );
    let variants = w.states.iter().map(|s| {
        let v = s.ident;
        let docs = variant_docs(w, s);
        quote!(#docs #v)
    });
    // Spanned at the enum's name: "the enum `DeliverState` is defined here" points at it.
    quote_spanned! {ident.span()=>
        #[doc = #doc]
        #[doc = ""]
        #[doc = #state_id]
        #[derive(
            ::core::clone::Clone,
            ::core::marker::Copy,
            ::core::cmp::PartialEq,
            ::core::cmp::Eq,
            ::core::hash::Hash,
            ::core::cmp::PartialOrd,
            ::core::cmp::Ord,
            ::core::fmt::Debug
        )]
        #vis enum #state_ident {
            #(#variants,)*
        }
    }
}

/// The user's doc comment of a state, or one naming it.
fn variant_docs(w: &Workflow, s: &State) -> TokenStream {
    if s.docs.is_empty() {
        let doc = format!(" The state [`{}::{}`].", w.ident, s.ident);
        quote!(#[doc = #doc])
    } else {
        let docs = &s.docs;
        quote!(#(#docs)*)
    }
}

fn state_id_impl(w: &Workflow) -> TokenStream {
    let krate = &w.krate;
    let state_ident = &w.state_ident;
    let all = w.states.iter().map(|s| s.ident);
    let initial = w.initial().map(|i| w.states[i].ident);
    let names = w.states.iter().map(|s| {
        let v = s.ident;
        let name = v.unraw().to_string();
        quote!(Self::#v => #name)
    });
    let nexts = w.states.iter().map(|s| {
        let v = s.ident;
        let targets = s.next.iter().map(|&i| w.states[i].ident);
        quote!(Self::#v => &[#(Self::#targets),*])
    });
    let terminals: Vec<&Ident> = w
        .states
        .iter()
        .filter(|s| s.is_terminal())
        .map(|s| s.ident)
        .collect();
    let is_terminal = if terminals.is_empty() {
        quote!(false)
    } else {
        quote!(::core::matches!(self, #(Self::#terminals)|*))
    };
    quote! {
        #[automatically_derived]
        impl #krate::StateId for #state_ident {
            const ALL: &'static [Self] = &[#(Self::#all),*];
            const INITIAL: Self = Self::#initial;
            fn name(self) -> &'static str {
                match self {
                    #(#names,)*
                }
            }
            fn next(self) -> &'static [Self] {
                match self {
                    #(#nexts,)*
                }
            }
            fn is_terminal(self) -> bool {
                #is_terminal
            }
        }

        #[automatically_derived]
        impl ::core::fmt::Display for #state_ident {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(#krate::StateId::name(*self))
            }
        }
    }
}

/// "`A`, `B` or `C`", for docs and messages.
fn list(w: &Workflow, indices: &[usize]) -> String {
    let names: Vec<String> = indices
        .iter()
        .map(|&i| format!("`{}`", w.states[i].ident))
        .collect();
    match names.as_slice() {
        [] => "none".to_owned(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}

/// `{V}Next`: the states `V` may move to, with their fields. Spanned at `#[next(...)]`, so that
/// "no variant named `X` found for enum `VNext`" also points at the list of allowed states.
fn next_enum(w: &Workflow, s: &State) -> TokenStream {
    let vis = w.vis;
    let ident = w.ident;
    let next_ident = Ident::new(&s.next_ident.to_string(), s.ident.span());
    let doc = format!(
        " Where a run in state [`{ident}::{v}`] may go next: {allowed}.\n\n The return \
         value of [`{handler}::{method}`]; each variant has the fields of the state of the \
         same name, and converts into [`{ident}`] with `From`. The variants are exactly the \
         states listed in `#[next(...)]` on `{v}`: returning any other state does not compile.",
        v = s.ident,
        allowed = list(w, &s.next),
        handler = w.handler_ident,
        method = s.method.unraw(),
    );
    let variants = s.next.iter().map(|&i| {
        let target = &w.states[i];
        // The name as written in `#[next(...)]`, so that "go to definition" lands there.
        let name = written_target(s, target);
        let docs = variant_docs(w, target);
        let fields = target.fields.iter().map(|f| {
            let docs = &f.docs;
            let ty = f.ty;
            match f.ident {
                Some(field) => quote!(#(#docs)* #field: #ty),
                None => quote!(#(#docs)* #ty),
            }
        });
        match target.style {
            Style::Struct => quote!(#docs #name { #(#fields),* }),
            Style::Tuple => quote!(#docs #name(#(#fields),*)),
            Style::Unit => quote!(#docs #name),
        }
    });
    quote_spanned! {s.next_span()=>
        #[doc = #doc]
        #[allow(clippy::large_enum_variant, clippy::enum_variant_names)]
        #vis enum #next_ident {
            #(#variants,)*
        }
    }
}

fn written_target(s: &State, target: &State) -> Ident {
    s.attrs
        .next
        .iter()
        .flat_map(|n| &n.targets)
        .find(|t| *t == target.ident)
        .cloned()
        .unwrap_or_else(|| target.ident.clone())
}

/// `impl From<{V}Next> for Enum`.
fn from_next_impl(w: &Workflow, s: &State) -> TokenStream {
    let ident = w.ident;
    let next_ident = &s.next_ident;
    let arms = s.next.iter().map(|&i| {
        let target = &w.states[i];
        let v = target.ident;
        let (members, bindings) = bindings(target);
        quote! {
            #next_ident::#v { #(#members: #bindings),* } => #ident::#v { #(#members: #bindings),* }
        }
    });
    quote! {
        #[automatically_derived]
        impl ::core::convert::From<#next_ident> for #ident {
            fn from(next: #next_ident) -> Self {
                match next {
                    #(#arms,)*
                }
            }
        }
    }
}

/// The members of a state's fields (`issue`, `0`) and local names to bind them to (`__f0`).
fn bindings(s: &State) -> (Vec<Member>, Vec<Ident>) {
    s.fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let member = match f.ident {
                Some(ident) => Member::Named(ident.clone()),
                None => Member::Unnamed(Index {
                    index: i as u32,
                    span: Span::call_site(),
                }),
            };
            (member, format_ident!("__f{}", i))
        })
        .unzip()
}

fn handler_trait(w: &Workflow) -> TokenStream {
    let krate = &w.krate;
    let vis = w.vis;
    let ident = w.ident;
    let handler = &w.handler_ident;
    let doc = format!(
        " The handlers of workflow [`{ident}`]: one method per non-terminal state, which \
         receives the state's data and returns the next state.\n\n Implement it with `async \
         fn`s; the runtime calls the method of the state a run is in (through \
         `loops::Dispatch`) and stores the state it returns. A method can only return the \
         states listed in its state's `#[next(...)]`."
    );
    // Two states whose methods would share a name were reported by `valid`; declaring the
    // method once keeps the compiler from reporting it again.
    let methods = w
        .states
        .iter()
        .enumerate()
        .filter(|&(i, s)| !s.is_terminal() && !w.states[..i].iter().any(|e| e.method == s.method))
        .map(|(_, s)| handler_method(w, s));
    quote_spanned! {ident.span()=>
        #[doc = #doc]
        #[allow(clippy::too_many_arguments)]
        #vis trait #handler: ::core::marker::Send + ::core::marker::Sync {
            /// The error the handlers return: anything that converts into `loops::BoxError`,
            /// such as `anyhow::Error` or an error type deriving `thiserror::Error`.
            type Error: ::core::convert::Into<#krate::BoxError> + ::core::marker::Send + 'static;

            #(#methods)*
        }
    }
}

fn handler_method(w: &Workflow, s: &State) -> TokenStream {
    let krate = &w.krate;
    let ident = w.ident;
    let method = &s.method;
    let next_ident = &s.next_ident;
    let heading = format!(" Handles state [`{ident}::{}`].", s.ident);
    let returns = format!(
        " Returns the next state, a [`{next_ident}`]: {}.",
        list(w, &s.next)
    );
    let user_docs = &s.docs;
    let separator = (!user_docs.is_empty()).then(|| quote!(#[doc = ""]));
    // The handler's context argument is `ctx`, unless a field already has that name.
    let taken = |name: &str| s.fields.iter().any(|f| f.arg == name);
    let ctx = ["ctx", "context", "__ctx"]
        .into_iter()
        .find(|n| !taken(n))
        .unwrap_or("__ctx");
    let ctx = Ident::new(ctx, Span::call_site());
    let args = s.fields.iter().map(|f| {
        let arg = &f.arg;
        let ty = f.ty;
        quote!(#arg: #ty)
    });
    // Spanned at the variant: "not all trait items implemented, missing: `edited`" then
    // shows the state the missing method handles.
    quote_spanned! {s.ident.span()=>
        #[doc = #heading]
        #separator
        #(#user_docs)*
        #[doc = ""]
        #[doc = #returns]
        fn #method(
            &self,
            #ctx: &#krate::Context,
            #(#args),*
        ) -> impl ::core::future::Future<
            Output = ::core::result::Result<#next_ident, Self::Error>,
        > + ::core::marker::Send;
    }
}

/// The body of `Dispatch::dispatch`: run the current state's handler.
fn dispatch_body(w: &Workflow) -> TokenStream {
    let krate = &w.krate;
    let ident = w.ident;
    let handler = &w.handler_ident;
    let arms = w.states.iter().map(|s| {
        let v = s.ident;
        let (members, bindings) = bindings(s);
        if s.is_terminal() {
            let name = v.unraw().to_string();
            quote! {
                #ident::#v { .. } => ::core::result::Result::Err(
                    #krate::terminal_dispatched(
                        <Self as #krate::Workflow>::NAME,
                        #name,
                    ),
                )
            }
        } else {
            let method = &s.method;
            let next_ident = &s.next_ident;
            quote! {
                #ident::#v { #(#members: #bindings),* } => {
                    match <__H as #handler>::#method(__handler, __ctx, #(#bindings),*).await {
                        ::core::result::Result::Ok(__next) => ::core::result::Result::Ok(
                            <Self as ::core::convert::From<#next_ident>>::from(__next),
                        ),
                        ::core::result::Result::Err(__error) => ::core::result::Result::Err(
                            #krate::handler_error(__error),
                        ),
                    }
                }
            }
        }
    });
    quote! {
        async move {
            match self {
                #(#arms,)*
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    /// The expansion as text, with the spacing `quote` gives it.
    fn expand(input: syn::DeriveInput) -> String {
        crate::derive(&input).to_string()
    }

    #[test]
    fn docs_are_carried_to_generated_items() {
        let out = expand(parse_quote! {
            pub(crate) enum Deliver {
                /// An issue arrived.
                #[initial]
                #[next(Planned)]
                Received { issue: String },
                /// Work is planned.
                #[next(Done)]
                Planned {
                    /// The plan as written.
                    plan: String,
                },
                #[terminal]
                Done,
            }
        });
        // On the state enum's variant, the handler method, and the `{V}Next` variant.
        assert_eq!(out.matches(" An issue arrived.\"").count(), 2, "{out}");
        assert_eq!(out.matches(" Work is planned.\"").count(), 3, "{out}");
        // Field docs go with the copied fields.
        assert!(
            out.contains(" The plan as written.\"] plan : String"),
            "{out}"
        );
        // States without docs get one naming them.
        assert!(out.contains("\" The state [`Deliver::Done`].\""), "{out}");
        // Methods list where the state may go.
        assert!(
            out.contains("\" Returns the next state, a [`ReceivedNext`]: `Planned`.\""),
            "{out}"
        );
        // The visibility is carried to every generated item.
        for item in [
            "enum DeliverState",
            "enum ReceivedNext",
            "enum PlannedNext",
            "trait DeliverHandler",
        ] {
            assert!(
                out.contains(&format!("pub (crate) {item}")),
                "{item}: {out}"
            );
        }
    }

    #[test]
    fn the_crate_path_replaces_loops_everywhere() {
        let out = expand(parse_quote! {
            #[workflow(crate = crate)]
            enum Job {
                #[initial]
                #[next(Done)]
                Start { n: u32 },
                #[terminal]
                Done,
            }
        });
        assert!(!out.contains("loops ::"), "{out}");
        assert!(
            out.contains("impl crate :: __private :: Workflow for Job"),
            "{out}"
        );
        assert!(
            out.contains("< u32 as crate :: __private :: Schema > :: SHAPE"),
            "{out}"
        );
        // The doc link names the public path.
        assert!(out.contains("\" [`StateId`]: crate::StateId\""), "{out}");
    }

    #[test]
    fn fallback_still_emits_the_types() {
        let out = expand(parse_quote! {
            enum Deliver {
                #[initial]
                #[next(Nowhere)]
                Received,
                #[terminal]
                Done,
            }
        });
        assert!(out.contains("compile_error !"), "{out}");
        assert!(out.contains("no state named `Nowhere`"), "{out}");
        assert!(out.contains("enum DeliverState"), "{out}");
        assert!(out.contains("trait DeliverHandler"), "{out}");
        assert!(out.contains(":: core :: future :: pending ()"), "{out}");
    }
}
