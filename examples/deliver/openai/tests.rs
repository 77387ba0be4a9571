//! The client against a fake chat-completions server in the test process (`fake_api.rs`):
//! the request it sends, a good answer and its tokens, 429 with `Retry-After` (seconds and
//! HTTP date), 5xx, refusals, a malformed answer, an off-schema answer, a hang, an unreachable
//! server; and the pure parts (Retry-After, back-off, schema) on their own.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::schema::{self, SchemaError};
use super::*;
use crate::project;
use crate::workflow::{Edit, TestCase};

#[path = "../tests/end_to_end/fake_api.rs"]
mod fake_api;

use fake_api::{FakeApi, Reply};

/// The demo crate's sources, as the agent reads them.
fn sources() -> Vec<SourceFile> {
    vec![SourceFile {
        path: "src/lib.rs".into(),
        text: project::LIB_RS.into(),
    }]
}

/// The plan the demo's issue calls for, as the prompt asks for it.
fn good_plan() -> Value {
    json!({
        "decision": "plan",
        "summary": "Fix add(): add the arguments instead of subtracting them",
        "edits": [{ "path": "src/lib.rs", "find": "    a - b", "replace": "    a + b" }],
    })
}

/// The change `good_plan` reads as.
fn planned() -> Decision {
    Decision::Plan(Change {
        summary: "Fix add(): add the arguments instead of subtracting them".into(),
        edits: vec![Edit {
            path: "src/lib.rs".into(),
            find: "    a - b".into(),
            replace: "    a + b".into(),
        }],
    })
}

/// A client of `api` with `tries` tries and `timeout` per request, whose waits between
/// tries are recorded (and not slept).
fn client(
    api: &FakeApi,
    tries: u32,
    timeout: Duration,
) -> (OpenAiModel, Arc<Mutex<Vec<Duration>>>) {
    let waits = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&waits);
    let wait: Wait = Arc::new(move |d| {
        recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(d);
        Box::pin(std::future::ready(()))
    });
    let model = OpenAiModel::new(Config {
        base_url: api.base_url(),
        api_key: Some("test-key".into()),
        model: "fake-model".into(),
        request_timeout: timeout,
        tries,
    })
    .expect("a client")
    .with_wait(wait);
    (model, waits)
}

/// A request time-out far above what a loopback answer takes, even on a loaded machine.
const PATIENT: Duration = Duration::from_secs(30);

fn waits(waits: &Arc<Mutex<Vec<Duration>>>) -> Vec<Duration> {
    waits.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

async fn plan(model: &OpenAiModel) -> Result<Answer<Decision>, ModelError> {
    let sources = sources();
    let prompt = Prompt::plan(&project::issue(), &sources).expect("a prompt");
    model.ask(&prompt, |a| schema::plan(a, &sources)).await
}

fn usage(requests: u32, prompt_tokens: u64, completion_tokens: u64) -> Usage {
    Usage {
        requests,
        prompt_tokens,
        completion_tokens,
    }
}

#[tokio::test]
async fn a_good_answer_is_read_with_its_tokens_and_the_request_has_the_documented_shape() {
    let api = FakeApi::scripted(vec![Reply::answer(&good_plan(), 1_200, 150)]);
    let (model, recorded) = client(&api, 4, PATIENT);
    let answer = model
        .plan(&project::issue(), &sources())
        .await
        .expect("a plan");
    assert_eq!(answer.value, planned());
    assert_eq!(answer.usage, usage(1, 1_200, 150));
    assert!(waits(&recorded).is_empty());

    let requests = api.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.authorization.as_deref(), Some("Bearer test-key"));
    assert_eq!(request.content_type.as_deref(), Some("application/json"));
    assert_eq!(request.body["model"], "fake-model");
    assert_eq!(request.body["stream"], false);
    assert_eq!(request.body["temperature"], 0.0);
    assert_eq!(
        request.body["response_format"],
        json!({ "type": "json_object" })
    );
    let roles: Vec<&Value> = request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| &m["role"])
        .collect();
    assert_eq!(roles, ["system", "user"]);
    let user = request.message("user").expect("a user message");
    assert!(user.starts_with("Issue #1: add() returns the difference of its arguments\n"));
    assert!(user.contains(&format!(
        "--- src/lib.rs\n{}--- end of src/lib.rs\n",
        project::LIB_RS
    )));
    assert!(
        user.contains(r#"{"decision": "plan", "summary": "#),
        "{user}"
    );
    assert!(
        user.contains(r#"{"decision": "decline", "reason": "#),
        "{user}"
    );
}

#[tokio::test]
async fn a_fix_prompt_names_the_failing_tests_and_none_is_no_fix() {
    let report = TestReport {
        passed: false,
        exit_code: Some(101),
        tests: vec![TestCase {
            name: "tests::mean_of_three_values".into(),
            passed: false,
            output: Some("assertion `left == right` failed".into()),
        }],
        compile_error: None,
    };
    let api = FakeApi::scripted(vec![Reply::answer(
        &json!({ "decision": "none", "reason": "I do not see the bug." }),
        900,
        12,
    )]);
    let (model, _) = client(&api, 1, PATIENT);
    let answer = model
        .fix(&project::issue(), &sources(), &report)
        .await
        .expect("an answer");
    assert_eq!(answer.value, None);
    assert_eq!(answer.usage, usage(1, 900, 12));
    let user = api.requests()[0]
        .message("user")
        .expect("a user message")
        .to_owned();
    assert!(
        user.contains("the tests were run: 1 of 1 tests fail.\n"),
        "{user}"
    );
    assert!(
        user.contains(
            "Failing test tests::mean_of_three_values:\nassertion `left == right` failed\n"
        ),
        "{user}"
    );
    assert!(
        user.contains(r#"{"decision": "fix", "summary": "#),
        "{user}"
    );
}

#[tokio::test]
async fn a_429_is_tried_again_after_its_retry_after_in_seconds() {
    let api = FakeApi::scripted(vec![
        Reply::error(429, "Rate limit reached for requests").with_header("retry-after", "3"),
        Reply::answer(&good_plan(), 1_200, 150),
    ]);
    let (model, recorded) = client(&api, 4, PATIENT);
    let answer = plan(&model).await.expect("a plan on the second try");
    assert_eq!(answer.value, planned());
    // Two requests; the tokens are the answer's (a 429 reports none).
    assert_eq!(answer.usage, usage(2, 1_200, 150));
    assert_eq!(waits(&recorded), [Duration::from_secs(3)]);
    assert_eq!(api.requests().len(), 2);
}

#[tokio::test]
async fn a_429_is_tried_again_after_its_retry_after_as_an_http_date() {
    let at = SystemTime::now() + Duration::from_secs(30);
    let api = FakeApi::scripted(vec![
        Reply::error(429, "slow down").with_header("retry-after", &httpdate::fmt_http_date(at)),
        Reply::answer(&good_plan(), 10, 5),
    ]);
    let (model, recorded) = client(&api, 2, PATIENT);
    plan(&model).await.expect("a plan on the second try");
    // The date has whole seconds: the wait is what is left of the 30 s when the 429 came.
    let waited = waits(&recorded);
    assert_eq!(waited.len(), 1, "{waited:?}");
    assert!(
        waited[0] <= Duration::from_secs(30) && waited[0] >= Duration::from_secs(20),
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_longest_wait_ends_the_call_at_once() {
    let api = FakeApi::scripted(vec![
        Reply::error(429, "quota").with_header("retry-after", "3600"),
    ]);
    let (model, recorded) = client(&api, 4, PATIENT);
    let err = plan(&model).await.expect_err("no wait of an hour");
    let ModelError::GaveUp {
        tries, why, last, ..
    } = &err
    else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!(*tries, 1);
    assert_eq!(
        why,
        "asked to wait 3600 s, more than the 60 s this client waits"
    );
    assert!(
        matches!(**last, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(3600))
    );
    assert_eq!(
        err.to_string(),
        format!(
            "{} answered HTTP 429 Too Many Requests (Retry-After: 3600 s): quota; gave up after \
             1 try (asked to wait 3600 s, more than the 60 s this client waits; 0 tokens spent)",
            model.endpoint
        )
    );
    assert!(waits(&recorded).is_empty());
    assert_eq!(api.requests().len(), 1);
}

#[tokio::test]
async fn a_500_is_tried_again_after_a_back_off_and_every_try_failing_gives_up() {
    let api = FakeApi::scripted(vec![
        Reply::error(
            500,
            "The server had an error while processing your request.",
        ),
        Reply::answer(&good_plan(), 7, 3),
    ]);
    let (model, recorded) = client(&api, 4, PATIENT);
    let answer = plan(&model).await.expect("a plan on the second try");
    assert_eq!(answer.usage, usage(2, 7, 3));
    assert_eq!(waits(&recorded), [FIRST_BACKOFF]);

    let api = FakeApi::start(|_, _| Reply::error(503, "overloaded"));
    let (model, recorded) = client(&api, 3, PATIENT);
    let err = plan(&model).await.expect_err("every try fails");
    let ModelError::GaveUp {
        tries,
        usage: spent,
        last,
        ..
    } = &err
    else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!((*tries, *spent), (3, usage(3, 0, 0)));
    assert!(
        matches!(**last, ModelError::Unavailable { status: 503, .. }),
        "{last:?}"
    );
    assert!(err.to_string().ends_with(
        "answered HTTP 503: overloaded; gave up after 3 tries (the last of 3 tries; 0 tokens spent)"
    ), "{err}");
    assert_eq!(waits(&recorded), [FIRST_BACKOFF, FIRST_BACKOFF * 2]);
    assert_eq!(api.requests().len(), 3);
}

#[tokio::test]
async fn refusals_are_permanent_after_one_request() {
    for status in [400, 401, 403, 404, 422] {
        let api = FakeApi::start(move |_, _| Reply::error(status, "Incorrect API key provided"));
        let (model, recorded) = client(&api, 4, PATIENT);
        let err = plan(&model).await.expect_err("refused");
        assert!(
            matches!(err, ModelError::Refused { status: s, .. } if s == status),
            "{status}: {err:?}"
        );
        assert!(!err.is_transient());
        assert_eq!(
            err.to_string(),
            format!(
                "{} refused the request with HTTP {status}, which no retry changes: Incorrect \
                 API key provided",
                model.endpoint
            )
        );
        assert_eq!(api.requests().len(), 1, "{status}");
        assert!(waits(&recorded).is_empty());
    }
}

#[tokio::test]
async fn a_malformed_answer_is_a_failed_try_that_says_what_was_wrong() {
    // Then a good one: the tokens of both are spent.
    let api = FakeApi::scripted(vec![
        Reply::completion("Sure! Here is the plan: change a - b to a + b.", 1_000, 20),
        Reply::answer(&good_plan(), 1_000, 40),
    ]);
    let (model, _) = client(&api, 4, PATIENT);
    let answer = plan(&model).await.expect("a plan on the second try");
    assert_eq!(answer.value, planned());
    assert_eq!(answer.usage, usage(2, 2_000, 60));

    // Always: the typed error, after every try.
    let api = FakeApi::start(|_, _| Reply::completion("{\"decision\": \"plan\", ", 50, 5));
    let (model, _) = client(&api, 2, PATIENT);
    let err = plan(&model).await.expect_err("never JSON");
    let ModelError::GaveUp {
        tries: 2,
        usage: spent,
        last,
        ..
    } = &err
    else {
        panic!("expected GaveUp after 2 tries, got {err:?}");
    };
    assert_eq!(*spent, usage(2, 100, 10));
    let ModelError::Malformed { what, usage: one } = &**last else {
        panic!("expected Malformed, got {last:?}");
    };
    assert_eq!(*one, usage(1, 50, 5));
    assert_eq!(
        what,
        "EOF while parsing a value at line 1 column 20, in an answer that starts \
         \"{\\\"decision\\\": \\\"plan\\\",\""
    );
    assert!(
        err.to_string()
            .starts_with("the model's answer is not JSON: EOF while parsing")
    );
}

#[tokio::test]
async fn a_refusal_or_an_empty_answer_is_malformed_and_its_tokens_are_counted() {
    let refusal = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": null, "refusal": "I cannot  help\nwith that." },
            "finish_reason": "stop",
        }],
        "usage": { "prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46 },
    });
    let empty = json!({
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "" }, "finish_reason": "length" }],
        "usage": { "prompt_tokens": 40, "completion_tokens": 4096, "total_tokens": 4136 },
    });
    let api = FakeApi::scripted(vec![
        Reply::raw(200, &refusal.to_string()),
        Reply::raw(200, &empty.to_string()),
    ]);
    let (model, _) = client(&api, 2, PATIENT);
    let err = plan(&model).await.expect_err("no usable answer");
    let ModelError::GaveUp {
        tries: 2,
        usage: spent,
        last,
        ..
    } = &err
    else {
        panic!("expected GaveUp after 2 tries, got {err:?}");
    };
    assert_eq!(*spent, usage(2, 80, 4_102));
    assert_eq!(
        last.to_string(),
        "the model's answer is not JSON: it is empty (finish_reason length)"
    );
    assert!(
        err.to_string()
            .ends_with("(the last of 2 tries; 4,182 tokens spent)"),
        "{err}"
    );

    let api = FakeApi::scripted(vec![Reply::raw(200, &refusal.to_string())]);
    let (model, _) = client(&api, 1, PATIENT);
    let ModelError::GaveUp { last, .. } = plan(&model).await.expect_err("refused") else {
        panic!("expected GaveUp");
    };
    assert_eq!(
        last.to_string(),
        "the model's answer is not JSON: the model refused: I cannot help with that."
    );
}

#[tokio::test]
async fn an_off_schema_answer_is_a_typed_error_naming_the_faulty_value() {
    let cases = [
        (
            json!({ "decision": "plan", "summary": "x", "edits": [{ "path": "src/lib.rs", "find": 42, "replace": "y" }] }),
            "at `edits[0].find`: expected a string, found the number 42",
        ),
        (
            json!({ "summary": "x", "edits": [] }),
            "at `decision`: missing (expected \"plan\" or \"decline\")",
        ),
        (
            json!({ "decision": "plan", "summary": "x", "edits": [{ "path": "src/lib.rs", "find": "a * b", "replace": "a + b" }] }),
            "at `edits[0].find`: edit of src/lib.rs: the text to replace occurs 0 times, expected \
             once: \"a * b\"",
        ),
        (
            json!({ "decision": "plan", "summary": "x", "edits": [{ "path": "src/main.rs", "find": "a", "replace": "b" }] }),
            "at `edits[0].path`: \"src/main.rs\" is not one of the sources (src/lib.rs)",
        ),
        (
            json!(["plan"]),
            "expected an object, found an array [\"plan\"]",
        ),
    ];
    for (answer, problem) in cases {
        let api = FakeApi::scripted(vec![Reply::answer(&answer, 30, 8)]);
        let (model, _) = client(&api, 1, PATIENT);
        let err = plan(&model).await.expect_err("off schema");
        let ModelError::GaveUp { tries: 1, last, .. } = &err else {
            panic!("expected GaveUp after 1 try, got {err:?}");
        };
        let ModelError::OffSchema {
            problem: found,
            usage: spent,
        } = &**last
        else {
            panic!("expected OffSchema, got {last:?}");
        };
        assert_eq!(found.to_string(), problem);
        assert_eq!(*spent, usage(1, 30, 8));
        assert!(err.to_string().starts_with(&format!(
            "the model's answer does not match the schema asked for: {problem}; gave up after 1 try"
        )), "{err}");
    }
}

#[tokio::test]
async fn a_hang_is_a_time_out_and_tried_again() {
    // A time-out short enough for a test, yet far above a loopback answer's time.
    let timeout = Duration::from_secs(2);
    let api = FakeApi::scripted(vec![Reply::Hang, Reply::answer(&good_plan(), 11, 2)]);
    let (model, recorded) = client(&api, 2, timeout);
    let answer = plan(&model).await.expect("a plan on the second try");
    assert_eq!(answer.usage, usage(2, 11, 2));
    assert_eq!(waits(&recorded), [FIRST_BACKOFF]);

    let api = FakeApi::scripted(vec![Reply::Hang]);
    let (model, _) = client(&api, 1, timeout);
    let err = plan(&model).await.expect_err("no answer");
    let ModelError::GaveUp { tries: 1, last, .. } = &err else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert!(
        matches!(**last, ModelError::TimedOut { timeout: t, .. } if t == timeout),
        "{last:?}"
    );
    assert!(
        err.to_string()
            .contains("sent no complete answer within 2 s (the request time-out)")
    );
}

#[tokio::test]
async fn an_unreachable_server_and_a_body_that_is_no_completion_are_failed_tries() {
    // A port nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let model = OpenAiModel::new(Config {
        base_url: format!("http://127.0.0.1:{port}/v1/"),
        api_key: None,
        model: "m".into(),
        request_timeout: PATIENT,
        tries: 1,
    })
    .expect("a client");
    let err = plan(&model).await.expect_err("nothing listens");
    let ModelError::GaveUp { last, .. } = &err else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert!(matches!(**last, ModelError::Transport { .. }), "{last:?}");
    assert!(last.is_transient());
    // Its message quotes reqwest's causes once: it has no `source` to say them again.
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "cannot get an answer from http://127.0.0.1:{port}/v1/chat/completions: "
        )),
        "{message}"
    );
    assert_eq!(format!("{:#}", anyhow::Error::new(err)), message);

    let api = FakeApi::scripted(vec![Reply::raw(200, r#"{"object": "list", "data": []}"#)]);
    let (model, _) = client(&api, 1, PATIENT);
    let err = plan(&model).await.expect_err("not a completion");
    let ModelError::GaveUp { last, .. } = &err else {
        panic!("expected GaveUp, got {err:?}");
    };
    let ModelError::NotACompletion { what, .. } = &**last else {
        panic!("expected NotACompletion, got {last:?}");
    };
    assert_eq!(
        what,
        "missing field `choices` at line 1 column 30 in \"{\\\"object\\\": \\\"list\\\", \\\"data\\\": []}\""
    );
}

#[test]
fn the_configuration_is_checked_before_anything_is_sent() {
    let config = |base_url: &str, model: &str, tries: u32| Config {
        base_url: base_url.into(),
        api_key: None,
        model: model.into(),
        request_timeout: PATIENT,
        tries,
    };
    let refused = |c: Config| match OpenAiModel::new(c) {
        Err(ModelError::Config(what)) => what,
        other => panic!("expected a configuration error, got {other:?}"),
    };
    assert_eq!(
        refused(config("localhost:8080", "m", 1)),
        "--base-url localhost:8080: not an http or https URL"
    );
    assert!(refused(config("not a url", "m", 1)).starts_with("--base-url \"not a url\": "));
    assert_eq!(
        refused(config("http://h/v1", " ", 1)),
        "--model-name is empty"
    );
    assert_eq!(
        refused(config("http://h/v1", "m", 0)),
        "--model-tries must be at least 1"
    );
    // With or without a trailing slash, the same endpoint.
    for base in ["http://h:1/v1", "http://h:1/v1/"] {
        let model = OpenAiModel::new(config(base, "m", 1)).expect("a client");
        assert_eq!(model.describe(), "m at http://h:1/v1/chat/completions");
    }
}

#[test]
fn retry_after_reads_seconds_http_dates_and_milliseconds() {
    let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").expect("a date");
    let cases = [
        ("120", Some(Duration::from_secs(120))),
        (" 0 ", Some(Duration::ZERO)),
        ("1.5", Some(Duration::from_millis(1500))),
        (
            "Wed, 21 Oct 2015 07:28:30 GMT",
            Some(Duration::from_secs(30)),
        ),
        // The obsolete forms, RFC 850 and asctime.
        (
            "Wednesday, 21-Oct-15 07:29:00 GMT",
            Some(Duration::from_secs(60)),
        ),
        ("Wed Oct 21 07:28:10 2015", Some(Duration::from_secs(10))),
        // A date in the past: no wait.
        ("Wed, 21 Oct 2015 07:00:00 GMT", Some(Duration::ZERO)),
        ("-5", None),
        ("soon", None),
        ("", None),
    ];
    for (value, wait) in cases {
        assert_eq!(parse_retry_after(value, now), wait, "{value:?}");
    }
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", "7".parse().expect("a header value"));
    assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(7)));
    headers.insert("retry-after-ms", "250".parse().expect("a header value"));
    assert_eq!(retry_after(&headers, now), Some(Duration::from_millis(250)));
    assert_eq!(retry_after(&HeaderMap::new(), now), None);
}

#[test]
fn the_back_off_doubles_to_its_cap_and_permanent_errors_are_not_retried() {
    let server = ModelError::Unavailable {
        endpoint: "e".into(),
        status: 502,
        retry_after: None,
        message: "m".into(),
    };
    let waits: Vec<Duration> = (1..8)
        .map(|try_no| next_wait(&server, try_no, 10).expect("a wait"))
        .collect();
    let ms = |ms| Duration::from_millis(ms);
    assert_eq!(
        waits,
        [
            ms(500),
            ms(1_000),
            ms(2_000),
            ms(4_000),
            ms(8_000),
            ms(8_000),
            ms(8_000)
        ]
    );
    assert_eq!(
        next_wait(&server, 10, 10),
        Err("the last of 10 tries".to_owned())
    );
    let refused = ModelError::Refused {
        endpoint: "e".into(),
        status: 401,
        message: "m".into(),
    };
    assert_eq!(
        next_wait(&refused, 1, 10),
        Err("no retry changes that".to_owned())
    );
    let hinted = ModelError::RateLimited {
        endpoint: "e".into(),
        retry_after: Some(Duration::from_secs(60)),
        message: "m".into(),
    };
    assert_eq!(next_wait(&hinted, 1, 10), Ok(Duration::from_secs(60)));
}

#[test]
fn the_schema_reads_plans_declines_and_fixes() {
    let sources = sources();
    let fenced = format!("```json\n{}\n```", good_plan());
    let value = schema::parse(&fenced).expect("JSON in a fence");
    assert_eq!(schema::plan(&value, &sources), Ok(planned()));
    let decline = json!({ "decision": "decline", "reason": "  Not a bug.  " });
    assert_eq!(
        schema::plan(&decline, &sources),
        Ok(Decision::Decline {
            reason: "Not a bug.".into()
        })
    );
    // Two edits of one file: the second is checked against the file the first left.
    let two = json!({
        "decision": "fix",
        "summary": "Fix both",
        "edits": [
            { "path": "src/lib.rs", "find": "    a - b", "replace": "    a + b" },
            { "path": "src/lib.rs", "find": "a + b", "replace": "b + a" },
        ],
    });
    let change = schema::fix(&two, &sources)
        .expect("a fix")
        .expect("some fix");
    assert_eq!(change.edits.len(), 2);
    let error = |answer: Value| schema::fix(&answer, &sources).expect_err("off schema");
    assert_eq!(
        error(json!({ "decision": "fix", "summary": "a\nb", "edits": [] })),
        SchemaError {
            at: "summary".into(),
            problem: "expected one line (a commit subject)".into()
        }
    );
    assert_eq!(
        error(json!({ "decision": "fix", "summary": "s", "edits": [] })).to_string(),
        "at `edits`: empty: a change needs at least one edit"
    );
    assert_eq!(
        error(json!({ "decision": "plan" })).to_string(),
        "at `decision`: expected \"fix\" or \"none\", found the string \"plan\""
    );
    assert_eq!(
        error(json!({ "decision": "fix", "summary": "s", "edits": [{ "path": "../x", "find": "a", "replace": "b" }] }))
            .to_string(),
        "at `edits[0].path`: edit path \"../x\" is not a plain relative path inside the repository"
    );
    assert_eq!(
        error(json!({ "decision": "fix", "summary": "s", "edits": [{ "path": "src/lib.rs", "find": "a - b" }] }))
            .to_string(),
        "at `edits[0].replace`: missing (expected a string)"
    );
    assert_eq!(
        schema::fix(&json!({ "decision": "none" }), &sources),
        Ok(None)
    );
}

/// The hints of `err` once handed to loops.
fn loops_hint(err: ModelError) -> loops::RetryHint {
    let err = for_loops(err);
    let boxed: loops::BoxError = err.into();
    loops::retry_hint(&*boxed)
}

#[tokio::test]
async fn failed_calls_reach_loops_with_their_hints() {
    // A refusal: permanent, so neither the step nor the state asks again.
    let api = FakeApi::start(|_, _| Reply::error(401, "Incorrect API key provided"));
    let (model, _) = client(&api, 4, PATIENT);
    let refused = plan(&model).await.expect_err("refused");
    assert_eq!(
        loops_hint(refused),
        loops::RetryHint {
            permanent: true,
            retry_after: None
        }
    );
    // A Retry-After longer than the client waits: the step waits it (parked) and asks again.
    let api = FakeApi::scripted(vec![
        Reply::error(429, "quota").with_header("retry-after", "3600"),
    ]);
    let (model, _) = client(&api, 4, PATIENT);
    let later = plan(&model)
        .await
        .expect_err("no wait of an hour in the client");
    assert_eq!(
        loops_hint(later),
        loops::RetryHint {
            permanent: false,
            retry_after: Some(Duration::from_secs(3600))
        }
    );
    // Every try of the call failed with a 503 without a hint: the step's back-off decides.
    let api = FakeApi::start(|_, _| Reply::error(503, "overloaded"));
    let (model, _) = client(&api, 2, PATIENT);
    let unavailable = plan(&model).await.expect_err("every try fails");
    assert_eq!(loops_hint(unavailable), loops::RetryHint::default());
    assert_eq!(step_policy().max_attempts, 3);
}

#[test]
fn a_review_is_read_with_its_concerns_and_refused_off_schema() {
    let review = schema::review(&json!({
        "summary": " Adds the arguments. ",
        "concerns": ["no test for overflow"]
    }))
    .unwrap();
    assert_eq!(
        review,
        crate::workflow::Review {
            summary: "Adds the arguments.".into(),
            concerns: vec!["no test for overflow".into()],
        }
    );
    // No concerns: an empty list.
    let review = schema::review(&json!({"summary": "Fine."})).unwrap();
    assert!(review.concerns.is_empty());
    let err = schema::review(&json!({"summary": "Fine.", "concerns": [3]})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "at `concerns[0]`: expected a non-empty string, found the number 3"
    );
    let err = schema::review(&json!({"concerns": []})).unwrap_err();
    assert_eq!(err.to_string(), "at `summary`: missing (expected a string)");
    // The prompt carries the diff and the tests' outcome.
    let report = TestReport {
        passed: true,
        exit_code: Some(0),
        tests: vec![TestCase {
            name: "tests::add".into(),
            passed: true,
            output: None,
        }],
        compile_error: None,
    };
    let prompt = Prompt::review(&project::issue(), "-a - b\n+a + b", &report).unwrap();
    assert!(prompt.user.contains("-a - b\n+a + b"), "{}", prompt.user);
    assert!(
        prompt.user.contains("(all 1 tests pass)"),
        "{}",
        prompt.user
    );
}
