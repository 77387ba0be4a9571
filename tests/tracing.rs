//! The runtime's spans and events: a run, its states and its steps carry run_id, workflow,
//! state, seq, attempt and step, and commits, failures and waits are logged.

use loops::{Context, RetryPolicy, Runtime, Workflow};
use serde::{Deserialize, Serialize};

mod logs;
use logs::captured;

/// `attempts` attempts of a state, 1 ms apart.
fn quick_retries(attempts: u32) -> RetryPolicy {
    let ms = std::time::Duration::from_millis(1);
    RetryPolicy::attempts(attempts).with_delays(ms, ms)
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "traced")]
enum Traced {
    #[initial]
    #[next(Done)]
    Start { n: u32 },
    #[terminal]
    Done { n: u32 },
}

struct Handler;

impl TracedHandler for Handler {
    type Error = loops::Error;

    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
        let n: u32 = ctx.step("double", || async move { Ok(n * 2) }).await?;
        if ctx.attempt() == 1 {
            return Err(loops::Error::RunNotFound {
                run_id: "first attempt fails".into(),
            });
        }
        Ok(StartNext::Done { n })
    }
}

#[tokio::test]
async fn runs_states_and_steps_are_traced_with_their_fields() {
    let sink = captured();

    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .retry(quick_retries(2))
        .open(dir.path().join("s.redb"))
        .unwrap();
    let done = rt
        .run("r-7", Traced::Start { n: 21 }, &Handler)
        .await
        .unwrap();
    assert_eq!(done, Traced::Done { n: 42 });

    let out = sink.of("r-7");
    for want in [
        "run{run_id=\"r-7\" workflow=\"traced\"}",
        "state{state=\"Start\" seq=0 attempt=1}",
        "state{state=\"Start\" seq=0 attempt=2}",
        "step{step=\"double\" occurrence=0}",
        "run started",
        "step recorded",
        "step replayed from the journal",
        "handler failed",
        "transition committed from=\"Start\" to=\"Done\" seq=1",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // The id names the run: run again with another input, it returns the recorded end, and
    // the log says the input was not used (helper-131).
    let again = rt.run("r-7", Traced::Start { n: 5 }, &Handler).await;
    assert_eq!(again.unwrap(), Traced::Done { n: 42 });
    let out = sink.of("r-7");
    let ended = "run has ended already: its recorded end is returned, and a new initial state \
                 given for it is not used state=Done seq=1 status=completed";
    assert!(out.contains(ended), "missing {ended:?} in:\n{out}");
    assert!(!out.contains("resuming run"), "{out}");
}

/// Fails its first attempt with `.0`, a secret, in a step's error.
struct Leaky(&'static str);

impl TracedHandler for Leaky {
    type Error = loops::BoxError;

    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
        let attempt = ctx.attempt();
        let secret = self.0;
        ctx.step("call", || async move {
            if attempt == 1 {
                Err::<u32, loops::BoxError>(format!("the API refused {secret}").into())
            } else {
                Ok(n)
            }
        })
        .await?;
        Ok(StartNext::Done { n })
    }
}

/// Runs `Leaky(secret)` as `run_id` on a runtime with a codec, `log_payloads` as given;
/// returns everything logged so far (by any test).
async fn logged_with_a_codec(
    run_id: &str,
    secret: &'static str,
    log_payloads: Option<bool>,
) -> String {
    let sink = captured();
    let dir = tempfile::tempdir().unwrap();
    let mut builder = Runtime::builder()
        .retry(quick_retries(2))
        .codec(loops::Keyring::new("k1", [3; 32]).unwrap());
    if let Some(on) = log_payloads {
        builder = builder.log_payloads(on);
    }
    let rt = builder.open(dir.path().join("s.redb")).unwrap();
    let done = rt
        .run(run_id, Traced::Start { n: 5 }, &Leaky(secret))
        .await
        .unwrap();
    assert_eq!(done, Traced::Done { n: 5 });
    let failures = rt.store().failures(run_id).await.unwrap();
    assert_eq!(failures.len(), 2, "the step's failure and the attempt's");
    sink.text()
}

/// With a codec, error texts (sealed in the store) are not logged: the WARN lines name the
/// run, state, seq, attempt and the error's kind. `log_payloads(true)` logs them.
#[tokio::test]
async fn with_a_codec_error_texts_are_not_logged_unless_asked() {
    let all = logged_with_a_codec("r-8", "secret-token=hunter2", None).await;
    assert!(!all.contains("hunter2"), "a secret was logged:\n{all}");
    let out = captured().of("r-8");
    let not_logged =
        "error=<not logged: payloads are sealed; RuntimeBuilder::log_payloads logs them>";
    for want in [
        "run{run_id=\"r-8\" workflow=\"traced\"}",
        "state{state=\"Start\" seq=0 attempt=1}",
        "step failed",
        "error_kind=\"step\"",
        "handler failed",
        "error_kind=\"handler\"",
        not_logged,
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert_eq!(out.matches(not_logged).count(), 2, "{out}");

    let all = logged_with_a_codec("r-8-logged", "secret-token=swordfish", Some(true)).await;
    assert_eq!(all.matches("secret-token=swordfish").count(), 2, "{all}");
    let out = captured().of("r-8-logged");
    assert_eq!(out.matches("secret-token=swordfish").count(), 2, "{out}");
    assert!(!out.contains("<not logged"), "{out}");
}

mod moved_v1 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "moved", version = 1)]
    pub enum Moved {
        #[initial]
        #[next(Done)]
        Start { token: String },
        #[terminal]
        Done { token: String },
    }
}

/// Version 2 of `moved`, whose migration refuses every state, quoting it.
mod moved_v2 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "moved", version = 2)]
    pub enum Moved {
        #[initial]
        #[next(Done)]
        Start { token: String, tries: u32 },
        #[terminal]
        Done { token: String },
    }

    impl loops::Migrate<super::moved_v1::Moved> for Moved {
        fn migrate(old: super::moved_v1::Moved) -> Result<Self, loops::BoxError> {
            Err(format!("cannot migrate {old:?}").into())
        }
    }
}

/// Waits in `Start` (version 1) for `go`.
struct Parks;

impl moved_v1::MovedHandler for Parks {
    type Error = loops::Error;

    async fn start(
        &self,
        ctx: &Context,
        token: String,
    ) -> Result<moved_v1::StartNext, Self::Error> {
        ctx.wait_for::<()>("go").await?;
        Ok(moved_v1::StartNext::Done { token })
    }
}

struct Never;

impl moved_v2::MovedHandler for Never {
    type Error = loops::Error;

    async fn start(
        &self,
        _: &Context,
        token: String,
        _: u32,
    ) -> Result<moved_v2::StartNext, Self::Error> {
        Ok(moved_v2::StartNext::Done { token })
    }
}

/// With a codec, a block's reason (sealed in the store: a migration's refusal may quote the
/// state) is not logged either; the line still names the run, state and schema.
#[tokio::test]
async fn with_a_codec_a_block_reason_is_not_logged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let keys = || loops::Keyring::new("k1", [3; 32]).unwrap();
    let rt = Runtime::builder().codec(keys()).open(&path).unwrap();
    rt.register::<moved_v1::Moved, _>(Parks);
    rt.start(
        "r-9",
        moved_v1::Moved::Start {
            token: "secret-token=hunter2".into(),
        },
    )
    .await
    .unwrap();
    rt.wait_for_status("r-9", loops::RunStatus::Waiting)
        .await
        .unwrap();
    rt.shutdown().await;
    drop(rt);

    let sink = captured();
    let rt = Runtime::builder()
        .codec(keys())
        .register::<moved_v2::Moved, _>(Never)
        .migration::<moved_v1::Moved, moved_v2::Moved>()
        .open(&path)
        .unwrap();
    rt.resume_all().await.unwrap();
    // The parked run is routed when it is ready: when `go` wakes it.
    rt.send("r-9", "go", &()).await.unwrap();
    let info = rt
        .wait_for_status("r-9", loops::RunStatus::Blocked)
        .await
        .unwrap();
    assert!(
        info.block.unwrap().reason.contains("hunter2"),
        "the reason is in the store, sealed"
    );
    // The driver logs the block after its write commits, and `shutdown` drops drivers at
    // their next await as a crash would: wait for the line before stopping it.
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let out = sink.of("r-9");
            if out.contains("run blocked") {
                return out;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no `run blocked` line within 10 s:\n{}", sink.of("r-9")));
    rt.shutdown().await;
    let all = sink.text();
    assert!(!all.contains("hunter2"), "a secret was logged:\n{all}");
    assert!(!out.contains("hunter2"), "a secret was logged:\n{out}");
    assert!(
        out.contains("run blocked")
            && out.contains("run_id=r-9")
            && out.contains(
                "reason=<not logged: payloads are sealed; RuntimeBuilder::log_payloads logs them>"
            ),
        "{out}"
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "noted")]
#[event(note: Note)]
enum Noted {
    #[initial]
    #[next(Done)]
    Ask,
    #[terminal]
    Done { text: String },
}

/// A note: never blank (its `Deserialize` checks).
#[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(try_from = "NoteFields")]
struct Note {
    text: String,
}

/// [`Note`] as it is sent, before its check.
#[derive(loops::Schema, Deserialize)]
struct NoteFields {
    text: String,
}

impl TryFrom<NoteFields> for Note {
    type Error = String;

    fn try_from(fields: NoteFields) -> Result<Note, String> {
        if fields.text.trim().is_empty() {
            return Err("a note is not blank".to_owned());
        }
        Ok(Note { text: fields.text })
    }
}

/// Takes a note, then fails its first execution: the next replays the wait.
#[derive(Default)]
struct NoteTaker {
    failed: std::sync::atomic::AtomicBool,
}

impl NotedHandler for NoteTaker {
    type Error = loops::Error;

    async fn ask(&self, ctx: &Context) -> Result<AskNext, Self::Error> {
        let note = ctx.wait_for(Noted::NOTE).await?;
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(loops::Error::RunNotFound {
                run_id: "first attempt fails".into(),
            });
        }
        Ok(AskNext::Done { text: note.text })
    }
}

/// An event set aside (a payload its type refuses) is warned of once, when it is set aside;
/// a replay of the wait skips it without a warning (helper-127 LOW 2: every resume warned
/// again of every event set aside before, as if new ones had just arrived).
#[tokio::test]
async fn an_event_set_aside_is_warned_of_once_not_at_every_replay() {
    let sink = captured();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let rt = Runtime::builder()
        .retry(quick_retries(3))
        .open(&path)
        .unwrap();
    rt.redb()
        .unwrap()
        .__seed_history([("noted-1".to_owned(), Noted::Ask)])
        .unwrap();
    let raw = |text: &str| serde_json::value::RawValue::from_string(text.to_owned()).unwrap();
    // Not registered here: the shape alone is checked at the send, and the wait sets the
    // blank one aside.
    rt.send_json("noted-1", "note", None, &raw(r#"{"text":" "}"#))
        .await
        .unwrap();
    rt.send_json("noted-1", "note", None, &raw(r#"{"text":"hi"}"#))
        .await
        .unwrap();
    let done = rt
        .run("noted-1", Noted::Ask, &NoteTaker::default())
        .await
        .unwrap();
    assert_eq!(done, Noted::Done { text: "hi".into() });
    let out = sink.of("noted-1");
    assert!(out.contains("handler failed"), "{out}");
    assert_eq!(
        sink.matching("event set aside: its payload does not decode", "noted-1"),
        1,
        "{out}"
    );
    assert_eq!(
        sink.matching("event set aside before, skipped on replay", "noted-1"),
        1,
        "{out}"
    );
}
