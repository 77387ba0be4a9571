//! The kinds of enums the derive supports: struct, tuple and unit variants, self-transitions
//! (retry loops), cycles (fix loops), visibilities, and names that need care.

use loops::{Context, Dispatch, StateId, Workflow};
use serde::{Deserialize, Serialize};

/// Every kind of variant, a retry loop on `Fetching` and a cycle `Checking -> Fixing ->
/// Checking`.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Job {
    /// A unit state.
    #[initial]
    #[next(Fetching)]
    Queued,
    /// A tuple state that may retry itself.
    #[next(Fetching, Checking, Failed)]
    Fetching(String, u32),
    #[next(Fixing, Done)]
    Checking { body: String },
    #[next(Checking)]
    Fixing {
        body: String,
        /// A field named like the handler's context argument.
        ctx: String,
    },
    #[terminal]
    Done,
    #[terminal]
    Failed(String),
}

struct Worker;

impl JobHandler for Worker {
    type Error = std::convert::Infallible;

    async fn queued(&self, _ctx: &Context) -> Result<QueuedNext, Self::Error> {
        Ok(QueuedNext::Fetching("https://example.com".into(), 0))
    }

    async fn fetching(
        &self,
        _ctx: &Context,
        url: String,
        attempt: u32,
    ) -> Result<FetchingNext, Self::Error> {
        Ok(match attempt {
            0 | 1 => FetchingNext::Fetching(url, attempt + 1),
            2 => FetchingNext::Checking { body: "bug".into() },
            _ => FetchingNext::Failed("too many attempts".into()),
        })
    }

    async fn checking(&self, _ctx: &Context, body: String) -> Result<CheckingNext, Self::Error> {
        Ok(if body.contains("bug") {
            CheckingNext::Fixing {
                body,
                ctx: "fix".into(),
            }
        } else {
            CheckingNext::Done
        })
    }

    async fn fixing(
        &self,
        _context: &Context,
        body: String,
        ctx: String,
    ) -> Result<FixingNext, Self::Error> {
        assert_eq!(ctx, "fix");
        Ok(FixingNext::Checking {
            body: body.replace("bug", "fixed"),
        })
    }
}

#[test]
fn variant_kinds_loops_and_cycles_run_to_the_end() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut state = Job::Queued;
    let mut trail = vec![state.state()];
    while !state.state().is_terminal() {
        let ctx = loops::__for_tests("job", trail.len() as u64, 1);
        state = runtime.block_on(state.dispatch(&Worker, &ctx)).unwrap();
        trail.push(state.state());
    }
    use JobState::*;
    assert_eq!(
        trail,
        [
            Queued, Fetching, Fetching, Fetching, Checking, Fixing, Checking, Done
        ]
    );
}

#[test]
fn self_transitions_and_cycles_are_in_the_table() {
    use JobState::*;
    assert!(Fetching.can_move_to(Fetching));
    assert!(Checking.can_move_to(Fixing) && Fixing.can_move_to(Checking));
    assert_eq!(Job::Failed("x".into()).state(), Failed);
    assert_eq!(Job::Fetching("u".into(), 1).state(), Fetching);
    assert_eq!(Job::NAME, "job");
}

mod inner {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    /// Generated items get the enum's visibility: `pub(crate)` here.
    #[derive(Workflow, Serialize, Deserialize)]
    #[workflow(name = "inner-job")]
    pub(crate) enum Crated {
        #[initial]
        #[next(Over)]
        Start,
        #[terminal]
        Over,
    }
}

#[test]
fn crate_visible_items_are_usable_outside_their_module() {
    struct H;
    impl inner::CratedHandler for H {
        type Error = std::io::Error;
        async fn start(&self, _: &Context) -> Result<inner::StartNext, Self::Error> {
            Ok(inner::StartNext::Over)
        }
    }
    assert_eq!(inner::CratedState::INITIAL, inner::CratedState::Start);
    assert_eq!(<inner::Crated as Workflow>::NAME, "inner-job");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ctx = loops::__for_tests("c", 0, 1);
    let next = runtime
        .block_on(inner::Crated::Start.dispatch(&H, &ctx))
        .unwrap();
    assert_eq!(next.state(), inner::CratedState::Over);
}

/// State names that are keywords in snake case, and acronyms.
#[derive(Workflow, Serialize, Deserialize)]
pub enum Keywords {
    #[initial]
    #[next(Loop)]
    Match,
    #[next(HTTPCall)]
    Loop,
    #[next(Done)]
    HTTPCall { r#type: String },
    #[terminal]
    Done,
}

struct K;

impl KeywordsHandler for K {
    type Error = std::io::Error;
    async fn r#match(&self, _: &Context) -> Result<MatchNext, Self::Error> {
        Ok(MatchNext::Loop)
    }
    async fn r#loop(&self, _: &Context) -> Result<LoopNext, Self::Error> {
        Ok(LoopNext::HTTPCall {
            r#type: "get".into(),
        })
    }
    async fn http_call(&self, _: &Context, r#type: String) -> Result<HTTPCallNext, Self::Error> {
        assert_eq!(r#type, "get");
        Ok(HTTPCallNext::Done)
    }
}

#[test]
fn keyword_and_acronym_state_names() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ctx = loops::__for_tests("k", 0, 1);
    let next = runtime
        .block_on(Keywords::Match.dispatch(&K, &ctx))
        .unwrap();
    assert_eq!(next.state(), KeywordsState::Loop);
    assert_eq!(KeywordsState::HTTPCall.name(), "HTTPCall");
}
