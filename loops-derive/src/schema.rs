//! `#[derive(Schema)]`: describes a payload struct or enum's stored form as a
//! `loops::schema::Shape`, from its fields' `Schema` impls and its serde attributes.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, GenericParam, Type, parse_quote};

use crate::ast::{Field, Style};
use crate::attr::{self, Place};
use crate::ctxt::Errors;
use crate::serde_attr;
use crate::shape::{Shapes, repr, tokens_text};

pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Errors::default();
    let serde = serde_attr::container(&input.attrs);
    let mut shapes = Shapes::new(Some(&input.ident));
    let name = input.ident.unraw().to_string();
    let params: Vec<TokenStream> = input
        .generics
        .type_params()
        .map(|p| {
            let t = &p.ident;
            quote!(<#t as ::loops::Schema>::SHAPE)
        })
        .collect();
    let note = serde.notes.join(", ");
    let shape = match &input.data {
        Data::Struct(data) => {
            attr::no_schema_attr(&cx, &input.attrs, Place::Struct);
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
                &::loops::schema::Shape::Struct(&::loops::schema::Struct {
                    name: #name,
                    params: &[#(#params),*],
                    tag: #tag,
                    fields: #fields,
                    note: #note,
                })
            }
        }
        Data::Enum(data) => {
            attr::no_schema_attr(&cx, &input.attrs, Place::Enum);
            let variants: Vec<TokenStream> = data
                .variants
                .iter()
                .filter_map(|variant| {
                    attr::no_schema_attr(&cx, &variant.attrs, Place::Variant);
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
                        Some(with) => opaque(&fields, with),
                        None => {
                            let rule = v.rename_all.or(serde.rename_all_fields);
                            shapes.fields(style, &fields, rule, false)
                        }
                    };
                    let note = v.notes.join(", ");
                    Some(quote! {
                        ::loops::schema::Variant { name: #stored, fields: #fields, note: #note }
                    })
                })
                .collect();
            let repr = repr(&serde);
            quote! {
                &::loops::schema::Shape::Enum(&::loops::schema::Enum {
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
            quote!(&::loops::schema::Shape::Scalar("union"))
        }
    };
    // `#[serde(into = "T")]`, `from`, `try_from`: stored as that type.
    let shape = match &serde.stored_as {
        Some(ty) => stored_as(ty),
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
            .push(parse_quote!(#t: ::loops::Schema));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let ident = &input.ident;
    let (error, shape) = match cx.finish() {
        None => (None, shape),
        // Still implement the trait, so that the types using this one report nothing more.
        Some(error) => (
            Some(error.to_compile_error()),
            quote!(&::loops::schema::Shape::Scalar("(invalid)")),
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
                &::loops::schema::Shape = #shape;
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
            impl #impl_generics ::loops::Schema for #ident #ty_generics #where_clause {
                const SHAPE: &'static ::loops::schema::Shape = #shape;
            }
        };
    }
}

fn stored_as(ty: &Type) -> TokenStream {
    quote_spanned!(ty.span()=> <#ty as ::loops::Schema>::SHAPE)
}

/// The data of a variant with `#[serde(with = "...")]`: opaque.
pub(crate) fn opaque(fields: &[Field], with: &str) -> TokenStream {
    let ty = fields
        .iter()
        .map(|f| tokens_text(quote::ToTokens::to_token_stream(f.ty)))
        .collect::<Vec<_>>()
        .join(", ");
    quote! {
        ::loops::schema::Fields::Newtype(&::loops::schema::Field::new(
            "0",
            &::loops::schema::Shape::Opaque { ty: #ty, with: #with },
        ))
    }
}
