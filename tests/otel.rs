//! The OpenTelemetry configuration of docs/operations.md ("OpenTelemetry traces"), with the
//! SDK's in-memory exporter in place of OTLP: `tracing-opentelemetry`'s layer over a tracer
//! provider, one run, and the spans loops opens (`run`, `state`, `step`) exported with their
//! names, attributes and parents, in one trace.

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;

use loops::{Context, RedbStore, Runtime, Workflow};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "traced")]
enum Traced {
    #[initial]
    #[next(Middle)]
    Start,
    #[next(Done)]
    Middle { n: u32 },
    #[terminal]
    Done { n: u32 },
}

struct Handler;

impl TracedHandler for Handler {
    type Error = loops::BoxError;

    async fn start(&self, ctx: &Context) -> Result<StartNext, Self::Error> {
        let n: u32 = ctx.step("compute", || async { Ok(21) }).await?;
        Ok(StartNext::Middle { n })
    }

    async fn middle(&self, _ctx: &Context, n: u32) -> Result<MiddleNext, Self::Error> {
        Ok(MiddleNext::Done { n: n * 2 })
    }
}

/// The string value of the attribute `key` of `span`.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

// A current-thread runtime, so that the subscriber set for this thread sees every span.
#[tokio::test(flavor = "current_thread")]
async fn loops_spans_are_exported_to_opentelemetry() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("loops-test");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    let _default = tracing::subscriber::set_default(subscriber);

    let runtime = Runtime::builder().build(RedbStore::in_memory().unwrap());
    let done = runtime
        .run("otel-1", Traced::Start, &Handler)
        .await
        .unwrap();
    assert_eq!(done, Traced::Done { n: 42 });
    runtime.shutdown().await;
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let named =
        |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };
    let run = named("run");
    assert_eq!(run.len(), 1, "{spans:#?}");
    let run = run[0];
    assert_eq!(attribute(run, "run_id").as_deref(), Some("otel-1"));
    assert_eq!(attribute(run, "workflow").as_deref(), Some("traced"));
    assert_eq!(run.parent_span_id, SpanId::INVALID);
    let trace = run.span_context.trace_id();

    let states = named("state");
    let mut seen: Vec<(String, String, String)> = states
        .iter()
        .map(|s| {
            assert_eq!(s.span_context.trace_id(), trace);
            assert_eq!(s.parent_span_id, run.span_context.span_id());
            (
                attribute(s, "state").unwrap(),
                attribute(s, "seq").unwrap(),
                attribute(s, "attempt").unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("Middle".to_owned(), "1".to_owned(), "1".to_owned()),
            ("Start".to_owned(), "0".to_owned(), "1".to_owned()),
        ]
    );

    let steps = named("step");
    assert_eq!(steps.len(), 1, "{spans:#?}");
    assert_eq!(attribute(steps[0], "step").as_deref(), Some("compute"));
    assert_eq!(attribute(steps[0], "occurrence").as_deref(), Some("0"));
    let start = states
        .iter()
        .find(|s| attribute(s, "state").as_deref() == Some("Start"))
        .unwrap();
    assert_eq!(steps[0].parent_span_id, start.span_context.span_id());
    assert_eq!(steps[0].span_context.trace_id(), trace);
}
