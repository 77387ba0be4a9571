//! The derive macros of loops, re-exported by `loops`: [`macro@Workflow`] turns an enum whose
//! variants are the states of a durable state machine into a workflow, and [`macro@Schema`]
//! describes the types stored in its states so that its schema hash sees into them.
//!
//! # `#[derive(Workflow)]`
//!
//! ```
//! use loops::{Context, Schema, Workflow};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Schema, Serialize, Deserialize, Debug, Clone)]
//! pub struct Issue { pub number: u64, pub title: String }
//!
//! #[derive(Workflow, Serialize, Deserialize, Debug, Clone)]
//! #[workflow(name = "deliver", version = 1)]
//! pub enum Deliver {
//!     /// An issue arrived.
//!     #[initial]
//!     #[next(Planned, Abandoned)]
//!     Received { issue: Issue },
//!     #[next(Edited)]
//!     Planned { issue: Issue, plan: String },
//!     #[next(Tested)]
//!     Edited { issue: Issue, commit: String },
//!     #[next(Edited, PrOpened)] // the fix loop
//!     Tested { issue: Issue, commit: String, passed: bool },
//!     #[terminal]
//!     PrOpened { url: String },
//!     #[terminal]
//!     Abandoned { reason: String },
//! }
//!
//! struct Agent;
//!
//! impl DeliverHandler for Agent {
//!     type Error = std::io::Error;
//!
//!     async fn received(&self, _ctx: &Context, issue: Issue) -> Result<ReceivedNext, Self::Error> {
//!         Ok(ReceivedNext::Planned { issue, plan: "fix the typo".into() })
//!     }
//!     async fn planned(&self, _: &Context, issue: Issue, plan: String) -> Result<PlannedNext, Self::Error> {
//!         Ok(PlannedNext::Edited { issue, commit: "abc123".into() })
//!     }
//!     async fn edited(&self, _: &Context, issue: Issue, commit: String) -> Result<EditedNext, Self::Error> {
//!         Ok(EditedNext::Tested { issue, commit, passed: true })
//!     }
//!     async fn tested(
//!         &self, _: &Context, issue: Issue, commit: String, passed: bool,
//!     ) -> Result<TestedNext, Self::Error> {
//!         Ok(if passed {
//!             TestedNext::PrOpened { url: format!("https://example.com/pr/{}", issue.number) }
//!         } else {
//!             TestedNext::Edited { issue, commit }
//!         })
//!     }
//! }
//! ```
//!
//! ## Attributes
//!
//! **`#[workflow(name = "...", version = N)]`** on the enum, both optional. `name` is stored
//! with every run (default: the enum's name in snake case, `"deliver"`); it must start with a
//! letter and contain only ASCII letters, digits, `_` and `-`. `version` (a `u32`, default 1)
//! is yours to bump when the meaning of stored data changes without its shape changing; it is
//! part of the schema hash.
//!
//! **`#[initial]`** on exactly one variant: the state runs start in.
//!
//! **`#[next(A, B, ...)]`** on every state that does not end runs: the states it may move to,
//! each listed once. A state may list itself (a retry loop) and states may form cycles (a fix
//! loop).
//!
//! ```
//! # use loops::Workflow;
//! # #[derive(Workflow, serde::Serialize, serde::Deserialize)]
//! # enum Fetch {
//! #[initial]
//! #[next(Fetching, Failed, Done)] // retries itself
//! Fetching { url: String, attempt: u32 },
//! # #[terminal] Failed, #[terminal] Done }
//! ```
//!
//! **`#[terminal]`** on the states that end runs. They have no handler and no next states.
//!
//! **`#[schema(as = T)]`** on a field: describe the field, for the schema hash, as the type
//! `T` (for a type from another crate that has no `Schema` impl: `#[schema(as = String)] url:
//! Url`). **`#[schema(recursive = T)]`** on a field: the type `T` inside it is an enclosing
//! type (see [recursion](#recursive-types)).
//!
//! The derive also reads the enum's `#[serde(...)]` attributes, which decide how states are
//! stored (see [the schema hash](#the-schema-hash)).
//!
//! Each of these is a compile error, reported at the token you wrote, all at once: an input
//! that is not an enum, or has no variants, or generic parameters (generic workflows are not
//! supported); a state with neither `#[next]` nor `#[terminal]`, or with both; an empty
//! `#[next()]`; a next state that does not exist (with a suggestion when a name is close) or
//! is listed twice; no `#[initial]` state or more than one; a state no chain of `#[next]`
//! reaches from the initial state; a state from which no terminal state can be reached (a run
//! that could never end); two states whose handler methods would have the same name; unknown,
//! repeated or malformed keys, and attributes on the wrong item. After an error the
//! generated types are still emitted, so code using them reports nothing more.
//!
//! ## What is generated
//!
//! For `enum Deliver`, with the enum's visibility and its variants' doc comments:
//!
//! - **`DeliverState`**: a fieldless enum with the same variant names, deriving `Clone`,
//!   `Copy`, `PartialEq`, `Eq`, `Hash`, `PartialOrd`, `Ord` and `Debug`, displayed as the
//!   state's name, and implementing `loops::StateId`: `ALL` (declaration order), `INITIAL`,
//!   `name()`, `next()`, `is_terminal()`.
//! - **`{V}Next`** for every non-terminal state `V` (`ReceivedNext`, `PlannedNext`, ...): an
//!   enum whose variants are exactly `V`'s next states, with the same fields as the states of
//!   the same name, and `impl From<ReceivedNext> for Deliver`.
//! - **`DeliverHandler`**: one method per non-terminal state, named after it in snake case
//!   (`PrOpened` becomes `pr_opened`; a keyword becomes a raw identifier), taking the state's
//!   fields by name (`field0`, `field1`, ... for a tuple variant):
//!
//!   ```ignore
//!   pub trait DeliverHandler: Send + Sync {
//!       type Error: Into<loops::BoxError> + Send + 'static;
//!       fn received(&self, ctx: &loops::Context, issue: Issue)
//!           -> impl Future<Output = Result<ReceivedNext, Self::Error>> + Send;
//!       // ...
//!   }
//!   ```
//!
//!   Implement it with `async fn`s. Any error converting into `loops::BoxError` works,
//!   `anyhow::Error` included.
//! - **`impl loops::Workflow for Deliver`**: `type State = DeliverState`, `NAME`, `VERSION`,
//!   `SCHEMA_HASH`, `SCHEMA` and `state()`.
//! - **`impl<H: DeliverHandler + ?Sized> loops::Dispatch<H> for Deliver`**: calls the current
//!   state's method with its fields and converts the result; its future is `Send`.
//!
//! A handler can only return its state's next states. Returning another one does not compile,
//! and the error points at the `#[next]` list:
//!
//! ```text
//! error[E0599]: no variant named `Edited` found for enum `ReceivedNext`
//!   --> src/deliver.rs:24:26
//!    |
//!  7 |     #[next(Planned, Abandoned)]
//!    |      -------------------------- variant `Edited` not found here
//! ...
//! 24 |         Ok(ReceivedNext::Edited { issue, commit })
//!    |                          ^^^^^^ variant not found in `ReceivedNext`
//! ```
//!
//! # `#[derive(Schema)]`
//!
//! Implements `loops::Schema` for a struct or enum stored in a state, describing what serde
//! writes for it, from its fields' own `Schema` impls and its serde attributes. Every type
//! stored in a workflow state implements `Schema`: derive it, or use `#[schema(as = T)]` on the
//! field. Generic types are supported (`Page<T>` requires `T: Schema`).
//!
//! ```
//! use loops::Schema;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Schema, Serialize, Deserialize)]
//! #[serde(tag = "type", rename_all = "snake_case")]
//! pub enum Step {
//!     Edit { file: String, line: u32 },
//!     Run { command: String },
//! }
//!
//! #[derive(Schema, Serialize, Deserialize)]
//! pub struct Plan {
//!     pub steps: Vec<Step>,
//!     #[serde(default)]
//!     pub notes: Option<String>,
//! }
//! ```
//!
//! ## Recursive types
//!
//! A type that contains itself (`Vec<Self>`, `Option<Box<Tree>>`) is handled: the derive
//! replaces its own name by a back-reference. Types that contain *each other* need a hint on
//! one of the fields that refers back, naming the enclosing type; without it, compilation
//! fails with a cycle error naming the constant
//! `if_this_cycles_add_schema_recursive_to_one_of_the_fields_that_refer_back`:
//!
//! ```
//! # use loops::Schema;
//! # use serde::{Deserialize, Serialize};
//! #[derive(Schema, Serialize, Deserialize)]
//! pub struct Folder { pub files: Vec<File> }
//!
//! #[derive(Schema, Serialize, Deserialize)]
//! pub struct File {
//!     #[schema(recursive = Folder)]
//!     pub subfolder: Option<Box<Folder>>,
//! }
//! ```
//!
//! # The schema hash
//!
//! `Workflow::SCHEMA_HASH` fingerprints everything that decides whether stored runs decode
//! the same way; the runtime refuses to resume a run whose stored hash differs. It is computed
//! at compile time by `const fn`s, from names and structure only, so it is identical across
//! builds, platforms and compiler versions. Runs are stored as JSON, whose objects are
//! unordered, so the hash ignores the order of fields, variants and states.
//!
//! **These change the hash**, at any depth of the types stored in states:
//! - the workflow's `name` or `version`;
//! - a state added, removed or renamed (its Rust name or its stored name), its kind (struct,
//!   tuple, newtype or unit), whether it is initial or terminal, its next states;
//! - a field added, removed, renamed (its stored name) or retyped; an `Option` added or
//!   removed; a sequence, set, map or array for another (or an array's length); tuple elements
//!   or tuple-struct fields reordered;
//! - an enum variant added, removed, renamed or reshaped; the order of the variants of an
//!   untagged enum;
//! - serde attributes that change the stored form: `rename`, `rename_all`, `rename_all_fields`,
//!   `skip`, `skip_serializing`, `skip_deserializing`, `skip_serializing_if`, `default`,
//!   `flatten`, `with`/`serialize_with`/`deserialize_with` (and the field's type as written),
//!   `tag`, `content`, `untagged`, `transparent`, `into`/`from`/`try_from` (and the target
//!   type's shape), and any serde attribute loops does not model (hashed as written).
//!
//! **These do not**: doc comments, comments and formatting; the order of named fields, of the
//! variants of tagged enums, of states and of `#[next]` lists; names of types and how types
//! are written (paths, aliases); `Box`, `Rc`, `Arc`, `Cow` and references; `Vec`, `VecDeque`
//! and other sequences for each other, `HashMap` for `BTreeMap`, `HashSet` for `BTreeSet`; a
//! newtype (`struct Id(u64)`) for what it holds; a `rename` that keeps the stored name;
//! moving fields into a `#[serde(flatten)]` struct; handler code; the serde attributes that
//! cannot change how stored data reads back (`alias`, `bound`, `borrow`, `crate`,
//! `expecting`, `deny_unknown_fields`).
//!
//! Limits: shapes nested more than 20 levels deep (each struct, enum, `Option`, collection or
//! tuple is a level) are hashed to that depth; a field with `#[serde(with = ...)]` is hashed by
//! its type as written and the path, not by what the functions write; hand-written `Schema`
//! impls are trusted.
//!
//! Alongside the hash, `Workflow::SCHEMA` describes the same shape, one line per field at any
//! depth, for the runtime to store once per hash; `loops::schema_diff(stored, Deliver::SCHEMA)`
//! then says what changed, for instance ``state `Tested`: field `report.log: String` added``:
//!
//! ```text
//! workflow deliver version 1
//! state Received (struct, initial) -> Planned | Abandoned
//!   issue: Issue
//!   issue.number: u64
//!   issue.title: String
//! state PrOpened (struct, terminal)
//!   url: String
//! ```
//!
//! # Source layout
//!
//! One phase per file: `ast` and `attr` model the input and its attributes (with `serde_attr`
//! for serde's), `valid` checks the model, `expand` generates the workflow's code, `shape`
//! the schema shapes (shared with `schema`, the `Schema` derive), and `fallback` the items
//! still emitted after an error. `ctxt` accumulates errors so all are reported at once.
#![forbid(unsafe_code)]

mod ast;
mod attr;
mod case;
mod ctxt;
mod expand;
mod fallback;
mod schema;
mod serde_attr;
mod shape;
mod valid;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives a durable workflow from an enum: one variant per state, `#[initial]` on the state
/// runs start in, `#[next(A, B)]` on every other state listing where it may go, `#[terminal]`
/// on the states that end runs, and optionally `#[workflow(name = "...", version = N)]` on the
/// enum; `#[schema(as = T)]` and `#[schema(recursive = T)]` on fields.
///
/// Generates, for `enum Deliver`: `DeliverState` (the fieldless state enum, implementing
/// `loops::StateId`), one `{V}Next` enum per non-terminal state `V` (the states `V` may move
/// to), the `DeliverHandler` trait (one async method per non-terminal state), and the
/// `loops::Workflow` and `loops::Dispatch` impls. The types stored in states must implement
/// `loops::Schema`.
///
/// ```
/// use loops::{StateId, Workflow};
///
/// #[derive(Workflow, serde::Serialize, serde::Deserialize)]
/// enum Review {
///     #[initial]
///     #[next(Approved, Open)]
///     Open { pr: u64 },
///     #[terminal]
///     Approved,
/// }
///
/// assert_eq!(ReviewState::INITIAL.next(), &[ReviewState::Approved, ReviewState::Open]);
/// assert_eq!(Review::NAME, "review");
/// ```
///
/// The crate documentation of `loops-derive` describes every attribute, the generated items
/// and what changes the schema hash.
#[proc_macro_derive(Workflow, attributes(workflow, initial, next, terminal, schema))]
pub fn derive_workflow(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}

/// Derives `loops::Schema` for a struct or enum stored in workflow states: describes its
/// stored form from its fields' `Schema` impls and its serde attributes, so that the schema
/// hash of the workflows storing it sees into it. `#[schema(as = T)]` and
/// `#[schema(recursive = T)]` on fields.
///
/// ```
/// #[derive(loops::Schema, serde::Serialize, serde::Deserialize)]
/// struct Tree {
///     value: u32,
///     children: Vec<Tree>,
/// }
/// ```
#[proc_macro_derive(Schema, attributes(schema))]
pub fn derive_schema(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    schema::derive(&input).into()
}
