//! `#[derive(Schema)]`: describes a payload struct or enum's stored form as a
//! `loops::Shape`, from its fields' `Schema` impls and its serde attributes.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, GenericParam, Path, Type, parse_quote};

use crate::ast::{Field, Style};
use crate::attr::{self, Place};
use crate::ctxt::Errors;
use crate::serde_attr;
use crate::shape::{Shapes, repr};
use crate::tokens::tokens_text;

// This function is long because it builds the struct and the enum shapes in one match over the
// input that shares the container's serde attributes and type parameters; one function per kind
// of data is a follow-up.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Errors::default();
    let serde = serde_attr::container(&input.attrs);
    let place = match &input.data {
        Data::Enum(_) => Place::Enum,
        Data::Struct(_) | Data::Union(_) => Place::Struct,
    };
    let krate_attr = attr::schema_container(&cx, &input.attrs, place);
    let krate = &krate_attr.items();
    let mut shapes = Shapes::new(krate, Some(&input.ident));
    let name = input.ident.unraw().to_string();
    let params: Vec<TokenStream> = input
        .generics
        .type_params()
        .map(|p| {
            let t = &p.ident;
            quote!(<#t as #krate::Schema>::SHAPE)
        })
        .collect();
    let note = serde.notes.join(", ");
    let shape = match &input.data {
        Data::Struct(data) => {
            let style = Style::of(&data.fields);
            let fields = Field::all(&cx, &data.fields);
            let tag = match &serde.tag {
                Some(tag) => {
                    let value = serde.rename.clone().unwrap_or_else(|| name.clone());
                    quote!(::core::option::Option::Some((#tag, #value)))
                }
                None => quote!(::core::option::Option::None),
            };
            // `transparent`: stored as its one field, whatever its name.
            let style = if serde.transparent {
                Style::Tuple
            } else {
                style
            };
            let fields = shapes.fields(style, &fields, serde.rename_all, serde.default);
            quote! {
                &#krate::schema::Shape::Struct(&#krate::schema::Struct {
                    name: #name,
                    params: &[#(#params),*],
                    tag: #tag,
                    fields: #fields,
                    note: #note,
                })
            }
        }
        Data::Enum(data) => {
            let variants: Vec<TokenStream> = data
                .variants
                .iter()
                .filter_map(|variant| {
                    attr::no_schema_attr(&cx, &variant.attrs);
                    let v = serde_attr::variant(&variant.attrs);
                    let fields = Field::all(&cx, &variant.fields);
                    if v.skip {
                        return None;
                    }
                    let ident = variant.ident.unraw().to_string();
                    let stored = v.rename.clone().unwrap_or_else(|| {
                        serde
                            .rename_all
                            .map_or(ident.clone(), |r| r.variant(&ident))
                    });
                    let style = Style::of(&variant.fields);
                    let fields = match &v.with {
                        Some(with) => opaque(krate, &fields, with),
                        None => {
                            let rule = v.rename_all.or(serde.rename_all_fields);
                            shapes.fields(style, &fields, rule, false)
                        }
                    };
                    let note = v.notes.join(", ");
                    Some(quote! {
                        #krate::schema::Variant { name: #stored, fields: #fields, note: #note }
                    })
                })
                .collect();
            let repr = repr(krate, &serde);
            quote! {
                &#krate::schema::Shape::Enum(&#krate::schema::Enum {
                    name: #name,
                    params: &[#(#params),*],
                    repr: #repr,
                    variants: &[#(#variants),*],
                    note: #note,
                })
            }
        }
        Data::Union(data) => {
            cx.spanned(
                data.union_token,
                "`#[derive(Schema)]` needs a struct or an enum: serde cannot store a union",
            );
            quote!(&#krate::schema::Shape::Scalar("union"))
        }
    };
    // `#[serde(into = "T")]`, `from`, `try_from`: stored as that type.
    let shape = match &serde.stored_as {
        Some(ty) => stored_as(krate, ty),
        None => shape,
    };
    let mut generics = input.generics.clone();
    let bounds: Vec<_> = generics
        .params
        .iter()
        .filter_map(|p| match p {
            GenericParam::Type(t) => Some(t.ident.clone()),
            _ => None,
        })
        .collect();
    let where_clause = generics.make_where_clause();
    for t in bounds {
        where_clause
            .predicates
            .push(parse_quote!(#t: #krate::Schema));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let ident = &input.ident;
    let (error, shape) = match cx.finish() {
        None => (None, shape),
        // A malformed `crate = ...`: an impl would name a path that may not resolve.
        Some(error) if krate_attr.is_invalid() => return error.to_compile_error(),
        // Still implement the trait, so that the types using this one report nothing more.
        Some(error) => (
            Some(error.to_compile_error()),
            quote!(&#krate::schema::Shape::Scalar("(invalid)")),
        ),
    };
    let markers = if error.is_none() {
        shapes.markers()
    } else {
        TokenStream::new()
    };
    // Types that contain each other without `#[schema(recursive = ...)]` make const
    // evaluation cycle, and rustc's cycle error names the constants involved: for a
    // non-generic type, route the shape through a constant whose name says what to do.
    let (hint, shape) = if input.generics.params.is_empty() {
        let hint = quote_spanned! {input.ident.span()=>
            #[allow(non_upper_case_globals)]
            const if_this_cycles_add_schema_recursive_to_one_of_the_fields_that_refer_back:
                &#krate::schema::Shape = #shape;
        };
        let shape =
            quote!(if_this_cycles_add_schema_recursive_to_one_of_the_fields_that_refer_back);
        (hint, shape)
    } else {
        (TokenStream::new(), shape)
    };
    quote! {
        #error
        const _: () = {
            #markers
            #hint
            #[automatically_derived]
            impl #impl_generics #krate::Schema for #ident #ty_generics #where_clause {
                const SHAPE: &'static #krate::schema::Shape = #shape;
            }
        };
    }
}

fn stored_as(krate: &Path, ty: &Type) -> TokenStream {
    quote_spanned!(ty.span()=> <#ty as #krate::Schema>::SHAPE)
}

/// The data of a variant with `#[serde(with = "...")]`: opaque.
pub(crate) fn opaque(krate: &Path, fields: &[Field], with: &str) -> TokenStream {
    let ty = fields
        .iter()
        .map(|f| tokens_text(quote::ToTokens::to_token_stream(f.ty)))
        .collect::<Vec<_>>()
        .join(", ");
    quote! {
        #krate::schema::Fields::Newtype(&#krate::schema::Field::new(
            "0",
            &#krate::schema::Shape::Opaque { ty: #ty, with: #with },
        ))
    }
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    #[test]
    fn the_crate_path_replaces_loops_everywhere() {
        let out = super::derive(&parse_quote! {
            #[schema(crate = "loops_core")]
            struct Page<T> {
                items: Vec<T>,
                next: Option<Box<Page<T>>>,
            }
        })
        .to_string();
        assert!(!out.contains(":: loops ::"), "{out}");
        for expected in [
            "impl < T > loops_core :: __private :: Schema for Page < T > where T : loops_core :: __private :: Schema",
            "& loops_core :: __private :: schema :: Shape :: Struct",
            // The recursion marker.
            "& loops_core :: __private :: schema :: Shape :: Recursive (\"Page\")",
        ] {
            assert!(out.contains(expected), "{expected}: {out}");
        }
    }
}
