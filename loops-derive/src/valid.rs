//! Semantic checks on the model: the transition graph and the attribute values. Every
//! problem is recorded, spanned at the token the user wrote.

use std::collections::VecDeque;

use syn::ext::IdentExt;

use crate::ast::Workflow;
use crate::case::closest;
use crate::ctxt::Errors;

impl Workflow<'_> {
    pub(crate) fn validate(&self, cx: &Errors) {
        if self.is_generic() {
            cx.spanned(
                &self.original.generics,
                "generic workflows are not supported: the stored state must have one fixed \
                 shape; use concrete types in the variants",
            );
        }
        if let Some(name) = &self.attrs.name {
            check_name(cx, name);
        }
        self.check_events(cx);
        if self.states.is_empty() {
            cx.spanned(
                self.ident,
                "a workflow needs at least one state: add variants, one per state",
            );
            return;
        }
        self.check_stored_names(cx);
        let graph_ok = self.check_states(cx);
        if graph_ok {
            self.check_graph(cx);
        }
    }

    /// Each state is stored under a name of its own, and read under none of another's: a
    /// record names its state by the name its data is stored under, so two states that share
    /// one (`#[serde(rename = "A")]` on `B`, an `alias`, an `untagged` state or enum) would
    /// have a record of one read back as the other, and the run driven on in a state it was
    /// not in.
    fn check_stored_names(&self, cx: &Errors) {
        if self.serde.untagged {
            cx.spanned(
                self.ident,
                "a workflow's states are stored under their names, and `#[serde(untagged)]` \
                 stores none: a record would be read back as the first state whose fields fit \
                 it, whichever state it was; remove `untagged` (`tag = \"...\"` keeps the name \
                 inside the data)",
            );
            return;
        }
        if self.serde.split_rename_all {
            cx.spanned(
                self.ident,
                "`rename_all` with a serialize rule and another (or no) deserialize rule: \
                 states would be written under names they are not read under, and no record \
                 could be read back; give one rule (`rename_all = \"...\"`)",
            );
        }
        let mut seen: Vec<(String, &syn::Ident)> = Vec::new();
        for s in &self.states {
            let refused = if s.serde.skip {
                Some(
                    "is `#[serde(skip)]` (or `skip_serializing`, `skip_deserializing`): a run in \
                     it could not be recorded, or read back",
                )
            } else if s.serde.split_rename {
                Some(
                    "is renamed for serializing or deserializing only: it would be written \
                     under a name it is not read under, and its records could not be read \
                     back; give it one name (`#[serde(rename = \"...\")]`)",
                )
            } else {
                None
            };
            if let Some(why) = refused {
                cx.spanned(s.ident, format!("state `{}` {why}", s.ident.unraw()));
                continue;
            }
            if s.serde.untagged {
                cx.spanned(
                    s.ident,
                    format!(
                        "state `{}` is `#[serde(untagged)]` or `#[serde(other)]`: a record of \
                         another state (one whose fields fit it, or any this build does not \
                         know) would be read back as it; remove the attribute",
                        s.ident.unraw()
                    ),
                );
                continue;
            }
            let ident = s.ident.unraw().to_string();
            let stored = s.serde.rename.clone().unwrap_or_else(|| {
                self.serde
                    .rename_all
                    .map_or(ident.clone(), |rule| rule.variant(&ident))
            });
            let mut names = vec![stored];
            for name in &s.serde.read_as {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
            for name in names {
                match seen.iter().find(|(seen, _)| *seen == name) {
                    Some((_, other)) => cx.spanned(
                        s.ident,
                        format!(
                            "state `{ident}` is stored or read under the name \"{name}\", as \
                             state `{}` is: a record of one would be read back as the other; \
                             give each state a name of its own (`#[serde(rename = \"...\")]`, \
                             without an `alias` of another's)",
                            other.unraw()
                        ),
                    ),
                    None => seen.push((name, s.ident)),
                }
            }
        }
    }

    /// Per-state checks; returns whether the transition graph is well-formed enough to check
    /// reachability without a cascade of follow-up errors.
    fn check_states(&self, cx: &Errors) -> bool {
        let mut graph_ok = true;
        let names: Vec<String> = self.states.iter().map(|s| s.ident.to_string()).collect();
        let mut initial: Option<&syn::Ident> = None;
        for (i, state) in self.states.iter().enumerate() {
            if let Some(attr) = state.attrs.initial {
                match initial {
                    None => initial = Some(state.ident),
                    Some(first) => {
                        graph_ok = false;
                        cx.spanned(
                            attr,
                            format!(
                                "more than one initial state: `{first}` is already `#[initial]`"
                            ),
                        );
                    }
                }
            }
            match (&state.attrs.next, state.attrs.terminal) {
                (None, None) => {
                    graph_ok = false;
                    cx.spanned(
                        state.ident,
                        format!(
                            "state `{}` has neither `#[next(...)]` nor `#[terminal]`: list the \
                             states it may move to, or mark it as ending the run",
                            state.ident
                        ),
                    );
                }
                (Some(next), Some(_)) => {
                    graph_ok = false;
                    cx.spanned(
                        next.original,
                        format!(
                            "state `{}` is `#[terminal]`, so it cannot have next states: remove \
                             `#[next(...)]` or `#[terminal]`",
                            state.ident
                        ),
                    );
                }
                // A malformed `#[next]` was reported when parsing it.
                (Some(next), _) if next.malformed => graph_ok = false,
                (Some(next), None) if next.targets.is_empty() => {
                    graph_ok = false;
                    cx.spanned(
                        next.original,
                        format!(
                            "empty `#[next()]`: list the states `{}` may move to, or mark it \
                             `#[terminal]`",
                            state.ident
                        ),
                    );
                }
                _ => {}
            }
            if let Some(next) = &state.attrs.next {
                for (k, target) in next.targets.iter().enumerate() {
                    if next.targets[..k].contains(target) {
                        cx.spanned(target, format!("`{target}` is listed twice"));
                    } else if !names.iter().any(|n| target == n) {
                        graph_ok = false;
                        let mut message = format!("no state named `{target}`");
                        match closest(&target.to_string(), names.iter().map(String::as_str)) {
                            Some(near) => message.push_str(&format!("; did you mean `{near}`?")),
                            None => message.push_str(&format!(
                                "; the states are: {}",
                                names
                                    .iter()
                                    .map(|n| format!("`{n}`"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )),
                        }
                        cx.spanned(target, message);
                    }
                }
            }
            if let Some(earlier) = self.states[..i].iter().find(|s| s.method == state.method) {
                cx.spanned(
                    state.ident,
                    format!(
                        "states `{}` and `{}` would both be handled by a method named `{}`: \
                         rename one",
                        earlier.ident, state.ident, state.method
                    ),
                );
            }
            if !state.is_terminal() && state.next_ident == *self.ident {
                cx.spanned(
                    state.ident,
                    format!(
                        "state `{}` needs a generated enum named `{}`, which is the workflow's \
                         own name: rename the state or the enum",
                        state.ident, state.next_ident
                    ),
                );
            }
        }
        if initial.is_none() {
            graph_ok = false;
            cx.spanned(
                self.ident,
                "no initial state: mark the state every run starts in with `#[initial]`",
            );
        }
        graph_ok
    }

    /// Event names are unique, also as the generated constants' names (`approve` and
    /// `Approve` would both be `APPROVE`).
    fn check_events(&self, cx: &Errors) {
        for (i, event) in self.attrs.events.iter().enumerate() {
            let name = event.name.unraw().to_string();
            let constant = crate::case::snake_case(&name).to_uppercase();
            let earlier = self.attrs.events[..i].iter().find(|e| {
                let other = e.name.unraw().to_string();
                other == name || crate::case::snake_case(&other).to_uppercase() == constant
            });
            if let Some(earlier) = earlier {
                cx.spanned(
                    &event.name,
                    format!(
                        "duplicate event `{name}`: `{}` is declared already (each event has one \
                         name and one payload type; both are named by the constant `{constant}`)",
                        earlier.name.unraw()
                    ),
                );
            }
        }
    }

    /// Every state is reachable from the initial state, and from every state a terminal
    /// state can be reached.
    fn check_graph(&self, cx: &Errors) {
        let n = self.states.len();
        let Some(initial) = self.initial() else {
            return;
        };
        let reachable = closure(n, [initial], |i| self.states[i].next.clone());
        if !self.states.iter().any(|s| s.is_terminal()) {
            cx.spanned(
                self.ident,
                "no state is `#[terminal]`: a run could never end; mark the states that end \
                 runs with `#[terminal]`",
            );
            return;
        }
        let terminals = (0..n).filter(|&i| self.states[i].is_terminal());
        let predecessors = |j: usize| {
            (0..n)
                .filter(|&i| self.states[i].next.contains(&j))
                .collect()
        };
        let can_end = closure(n, terminals, predecessors);
        let initial_name = self.states[initial].ident;
        for (i, state) in self.states.iter().enumerate() {
            if !reachable[i] {
                cx.spanned(
                    state.ident,
                    format!(
                        "state `{}` is unreachable: no chain of `#[next(...)]` leads to it from \
                         the initial state `{initial_name}`",
                        state.ident
                    ),
                );
            } else if !can_end[i] {
                cx.spanned(
                    state.ident,
                    format!(
                        "no terminal state can be reached from state `{}`: a run that enters \
                         it could never end",
                        state.ident
                    ),
                );
            }
        }
    }
}

/// The states reachable from `start` along `edges`.
fn closure(
    n: usize,
    start: impl IntoIterator<Item = usize>,
    edges: impl Fn(usize) -> Vec<usize>,
) -> Vec<bool> {
    let mut seen = vec![false; n];
    let mut queue: VecDeque<usize> = start.into_iter().collect();
    for &i in &queue {
        seen[i] = true;
    }
    while let Some(i) = queue.pop_front() {
        for j in edges(i) {
            if !seen[j] {
                seen[j] = true;
                queue.push_back(j);
            }
        }
    }
    seen
}

/// A workflow name is stored with every run and shown in logs: a letter, then ASCII letters,
/// digits, `_` or `-`.
fn check_name(cx: &Errors, name: &syn::LitStr) {
    let value = name.value();
    let mut chars = value.chars();
    let message = match chars.next() {
        None => "the workflow name is empty".to_owned(),
        Some(first)
            if first.is_ascii_alphabetic()
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            return;
        }
        Some(_) => format!(
            "workflow name {value:?} is not identifier-like: use a letter followed by ASCII \
             letters, digits, `_` or `-`"
        ),
    };
    cx.spanned(name, message);
}
