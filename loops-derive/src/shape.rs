//! Code that describes a type's stored form as a `loops::Shape`: shared by
//! `#[derive(Schema)]` (payload types) and `#[derive(Workflow)]` (the states' fields).
//!
//! Each field's type is described through its `Schema` impl (`<T as ::loops::Schema>::SHAPE`),
//! never through its tokens, so aliases and paths do not matter and nested types are seen.
//! A type's own name inside its fields (and the names in `#[schema(recursive = ...)]`) is
//! replaced by a local marker type whose shape is `Shape::Recursive(name)`: a recursive type
//! then has a finite shape, and const evaluation does not cycle.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Ident, Path, Type};

use crate::ast::{Field, Style};
use crate::serde_attr::Rule;
use crate::tokens::tokens_text;

/// Builds shape expressions, collecting the recursion markers they use.
pub(crate) struct Shapes {
    /// The path to loops (`crate = ...`, else `::loops`).
    krate: Path,
    /// The type's own name (`#[derive(Schema)]`), which `Self` also means.
    own: Option<String>,
    /// `(name, marker)` for every name replaced so far.
    markers: Vec<(String, Ident)>,
}

impl Shapes {
    pub(crate) fn new(krate: &Path, own: Option<&Ident>) -> Self {
        Shapes {
            krate: krate.clone(),
            own: own.map(|i| i.to_string()),
            markers: Vec::new(),
        }
    }

    /// The marker types and their `Schema` impls, to emit in the same `const _` block as the
    /// shapes that use them.
    pub(crate) fn markers(&self) -> TokenStream {
        let krate = &self.krate;
        let items = self.markers.iter().map(|(name, marker)| {
            quote! {
                struct #marker;
                impl #krate::Schema for #marker {
                    const SHAPE: &'static #krate::schema::Shape =
                        &#krate::schema::Shape::Recursive(#name);
                }
            }
        });
        quote!(#(#items)*)
    }

    fn marker(&mut self, name: &str) -> Ident {
        if let Some((_, marker)) = self.markers.iter().find(|(n, _)| n == name) {
            return marker.clone();
        }
        let marker = format_ident!("__LoopsRecursive{}", self.markers.len());
        self.markers.push((name.to_owned(), marker.clone()));
        marker
    }

    /// `<T as ::loops::Schema>::SHAPE` (or under the `crate = ...` path), spanned at the type so that a missing impl is
    /// reported on the field.
    pub(crate) fn of_type(&mut self, ty: &Type, recursive: &[Ident]) -> TokenStream {
        let mut names: Vec<String> = recursive.iter().map(ToString::to_string).collect();
        if let Some(own) = &self.own {
            names.push(own.clone());
        }
        let mut replaced = ty.clone();
        let mut replace = Replace {
            shapes: self,
            names: &names,
        };
        replace.visit_type_mut(&mut replaced);
        let krate = &self.krate;
        quote_spanned!(ty.span()=> <#replaced as #krate::Schema>::SHAPE)
    }

    /// A `::loops::Field`, or `None` for a field serde skips.
    fn field(
        &mut self,
        name: String,
        field: &Field,
        container_default: bool,
    ) -> Option<TokenStream> {
        let serde = &field.serde;
        if serde.skipped() {
            return None;
        }
        let krate = self.krate.clone();
        let shape = if let Some(with) = &serde.with {
            let ty = tokens_text(field.ty.to_token_stream());
            quote!(&#krate::schema::Shape::Opaque { ty: #ty, with: #with })
        } else if let Some(as_type) = &field.schema.as_type {
            quote_spanned!(as_type.span()=> <#as_type as #krate::Schema>::SHAPE)
        } else {
            self.of_type(field.ty, &field.schema.recursive)
        };
        let mut flags = Vec::new();
        for (set, flag) in [
            (serde.default || container_default, "DEFAULT"),
            (serde.flatten, "FLATTEN"),
            (serde.skip_serializing, "SKIP_SERIALIZING"),
            (serde.skip_deserializing, "SKIP_DESERIALIZING"),
            (serde.skip_serializing_if, "SKIP_SERIALIZING_IF"),
        ] {
            if set {
                let flag = Ident::new(flag, Span::call_site());
                flags.push(quote!(.with(#krate::schema::FieldFlags::#flag)));
            }
        }
        let note = serde.notes.join(", ");
        Some(quote! {
            #krate::schema::Field {
                name: #name,
                shape: #shape,
                flags: #krate::schema::FieldFlags::NONE #(#flags)*,
                note: #note,
            }
        })
    }

    /// A `::loops::Fields` for a struct, variant or state; `rule` is the `rename_all`
    /// that applies to its field names.
    pub(crate) fn fields(
        &mut self,
        style: Style,
        fields: &[Field],
        rule: Option<Rule>,
        container_default: bool,
    ) -> TokenStream {
        let mut kept = Vec::new();
        for field in fields {
            let name = match field.ident {
                Some(ident) => match &field.serde.rename {
                    Some(rename) => rename.clone(),
                    None => {
                        let name = syn::ext::IdentExt::unraw(ident).to_string();
                        rule.map_or(name.clone(), |r| r.field(&name))
                    }
                },
                None => kept.len().to_string(),
            };
            if let Some(field) = self.field(name, field, container_default) {
                kept.push(field);
            }
        }
        let krate = &self.krate;
        match (style, kept.as_slice()) {
            (Style::Unit, _) => quote!(#krate::schema::Fields::Unit),
            (Style::Tuple, [one]) => quote!(#krate::schema::Fields::Newtype(&#one)),
            (Style::Tuple, _) => quote!(#krate::schema::Fields::Tuple(&[#(#kept),*])),
            (Style::Struct, _) => quote!(#krate::schema::Fields::Named(&[#(#kept),*])),
        }
    }
}

/// Replaces the types named in `names` (and `Self`) by recursion markers.
struct Replace<'a> {
    shapes: &'a mut Shapes,
    names: &'a [String],
}

impl VisitMut for Replace<'_> {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::Path(path) = ty
            && path.qself.is_none()
        {
            let name = if path.path.is_ident("Self") {
                self.shapes.own.clone()
            } else {
                path.path
                    .segments
                    .last()
                    .map(|s| s.ident.to_string())
                    .filter(|last| self.names.contains(last))
            };
            if let Some(name) = name {
                let marker = self.shapes.marker(&name);
                *ty = syn::parse_quote_spanned!(ty.span()=> #marker);
                return;
            }
        }
        visit_mut::visit_type_mut(self, ty);
    }
}

/// `::loops::Repr::...` for a container's serde attributes.
pub(crate) fn repr(krate: &Path, serde: &crate::serde_attr::Container) -> TokenStream {
    match (&serde.tag, &serde.content, serde.untagged) {
        (_, _, true) => quote!(#krate::schema::Repr::Untagged),
        (Some(tag), Some(content), _) => {
            quote!(#krate::schema::Repr::Adjacent { tag: #tag, content: #content })
        }
        (Some(tag), None, _) => quote!(#krate::schema::Repr::Internal { tag: #tag }),
        (None, _, _) => quote!(#krate::schema::Repr::External),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tokens_text;
    use syn::parse_quote;

    #[test]
    fn type_text_is_normalized() {
        let cases: [(Type, &str); 5] = [
            (parse_quote!(Vec<Option<String>>), "Vec<Option<String>>"),
            (parse_quote!(&'static str), "&'static str"),
            (parse_quote!([u8; 4]), "[u8; 4]"),
            (parse_quote!(HashMap<String,u64>), "HashMap<String, u64>"),
            (
                parse_quote!(Box<dyn Fn(u8) -> u8 + Send>),
                "Box<dyn Fn(u8) -> u8 + Send>",
            ),
        ];
        for (ty, text) in cases {
            assert_eq!(tokens_text(ty.to_token_stream()), text);
        }
    }

    #[test]
    fn own_name_and_recursive_names_become_markers() {
        let mut shapes = Shapes::new(&parse_quote!(::loops), Some(&parse_quote!(Tree)));
        let ty: Type = parse_quote!(Vec<Box<Tree>>);
        let out = shapes.of_type(&ty, &[]).to_string();
        assert_eq!(
            out,
            "< Vec < Box < __LoopsRecursive0 > > as :: loops :: Schema > :: SHAPE"
        );
        let ty: Type = parse_quote!(Option<(Self, Forest)>);
        let out = shapes.of_type(&ty, &[parse_quote!(Forest)]).to_string();
        assert_eq!(
            out,
            "< Option < (__LoopsRecursive0 , __LoopsRecursive1) > as :: loops :: Schema > :: SHAPE"
        );
        assert_eq!(shapes.markers.len(), 2);
    }
}
