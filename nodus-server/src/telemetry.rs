//! OpenTelemetry traces over OTLP/HTTP (protobuf): the engine's spans (built by nodus-core's
//! `telemetry` from the journal, with deterministic ids) go through a bounded queue to one
//! task that posts them in batches with opentelemetry-otlp's exporter.
//!
//! A run never waits for export: a full queue drops the span and counts it, an export that
//! fails (the endpoint down) counts its spans as dropped too (`/metrics`). A graceful stop
//! ([`Flush::finish`]) exports what is queued, within [`FLUSH_BOUND`]. Header values
//! (`OTEL_EXPORTER_OTLP_HEADERS`, read by the exporter) are secrets and are never logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use nodus_core::telemetry::{Content, Span, SpanKind, SpanSink, Value};
use opentelemetry::trace::{Link, SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, StringValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use tokio::sync::mpsc;

/// Spans held for export at most; more are dropped (and counted) until the exporter catches
/// up.
pub const QUEUE: usize = 8192;
/// Spans per OTLP request at most.
const BATCH: usize = 512;
/// How long one export may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long the task gathers spans after the first before it posts them (fewer, fuller
/// requests; also the longest a span waits in this process, which a crash can lose).
const LINGER: Duration = Duration::from_millis(50);
/// How long a graceful stop waits for the queued spans to be exported.
pub const FLUSH_BOUND: Duration = Duration::from_secs(10);

/// Where and what to export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpOptions {
    /// The collector's base URL (as `OTEL_EXPORTER_OTLP_ENDPOINT`): spans go to
    /// `{endpoint}/v1/traces`.
    pub endpoint: String,
    /// Whether spans carry message content (off by default: prompts can hold secrets).
    pub content: Content,
}

impl OtlpOptions {
    /// The traces URL: the endpoint with `/v1/traces` appended to its path.
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint.trim_end_matches('/'))
    }
}

/// What the exporter did, for `/metrics`.
#[derive(Debug, Default)]
pub struct SpanCounters {
    /// Spans the endpoint accepted.
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Spans dropped because their export failed (the endpoint down or refusing).
    pub dropped_export_failed: AtomicU64,
}

/// The engine's span sink: queues spans for the export task, never waiting.
#[derive(Debug)]
pub struct OtlpSpans {
    queue: mpsc::Sender<Span>,
    content: Content,
    counters: Arc<SpanCounters>,
}

impl SpanSink for OtlpSpans {
    fn enabled(&self) -> bool {
        true
    }

    fn content(&self) -> Content {
        self.content
    }

    fn export(&self, span: Span) {
        if self.queue.try_send(span).is_err() {
            self.counters
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Why the exporter cannot start.
#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter: {0}")]
pub struct Error(String);

/// The export task, to stop it gracefully: [`Flush::finish`].
#[derive(Debug)]
pub struct Flush {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    counters: Arc<SpanCounters>,
}

impl Flush {
    /// Stop taking spans, export those queued, and end the task; after `bound` it is cut,
    /// and the spans it had not exported yet are lost (the log says so).
    pub async fn finish(self, bound: Duration) {
        let _ = self.stop.send(());
        let Flush {
            mut task, counters, ..
        } = self;
        if tokio::time::timeout(bound, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(bound = ?bound, "OTLP export did not finish in time at the stop; its queued spans are dropped");
        }
        tracing::info!(
            exported = counters.exported.load(Ordering::Relaxed),
            "OTLP export finished"
        );
    }
}

/// Build the exporter and start its task (on the current tokio runtime). The task ends when
/// [`Flush::finish`] stops it (or the `Flush` is dropped), after exporting what is queued;
/// spans handed over after that are dropped and counted (`queue_full`).
pub fn start(
    options: &OtlpOptions,
    counters: Arc<SpanCounters>,
) -> Result<(Arc<OtlpSpans>, Flush), Error> {
    let client = nodus_llm::http::client_builder(&nodus_llm::http::HttpConfig::default())
        .map_err(|e| Error(e.to_string()))?
        .timeout(TIMEOUT)
        .build()
        .map_err(|e| Error(e.to_string()))?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(options.traces_url())
        .with_timeout(TIMEOUT)
        .build()
        .map_err(|e| Error(e.to_string()))?;
    exporter.set_resource(&Resource::builder().with_service_name("nodus").build());
    let (queue, mut receiving) = mpsc::channel::<Span>(QUEUE);
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task_counters = counters.clone();
    let task = tokio::spawn(async move {
        let scope = InstrumentationScope::builder("nodus")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let mut spans = Vec::with_capacity(BATCH);
        // One warning per streak of failures, not one per batch.
        let mut failing = false;
        let mut stopping = false;
        loop {
            let received = if stopping {
                receiving.recv_many(&mut spans, BATCH).await
            } else {
                tokio::select! {
                    received = receiving.recv_many(&mut spans, BATCH) => received,
                    // Stopped (or the handle dropped): take no more, export what is queued.
                    _ = &mut stopped => {
                        receiving.close();
                        stopping = true;
                        continue;
                    }
                }
            };
            if received == 0 {
                break;
            }
            let until = tokio::time::Instant::now() + LINGER;
            while spans.len() < BATCH {
                let room = BATCH - spans.len();
                match tokio::time::timeout_at(until, receiving.recv_many(&mut spans, room)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let count = spans.len() as u64;
            let batch: Vec<SpanData> = spans.drain(..).map(|s| span_data(s, &scope)).collect();
            match exporter.export(batch).await {
                Ok(()) => {
                    task_counters.exported.fetch_add(count, Ordering::Relaxed);
                    if failing {
                        tracing::info!("OTLP export works again");
                        failing = false;
                    }
                }
                Err(error) => {
                    task_counters
                        .dropped_export_failed
                        .fetch_add(count, Ordering::Relaxed);
                    if !failing {
                        tracing::warn!(error = %error, "OTLP export failed; its spans are dropped (counted in /metrics)");
                        failing = true;
                    }
                }
            }
        }
    });
    let sink = Arc::new(OtlpSpans {
        queue,
        content: options.content,
        counters: counters.clone(),
    });
    Ok((
        sink,
        Flush {
            stop,
            task,
            counters,
        },
    ))
}

/// A URL as the server may print it: without a user name or password.
pub fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "(an invalid URL)".to_string(),
    }
}

/// A span as the OpenTelemetry SDK's exporter takes it, with its ids as they are.
fn span_data(span: Span, scope: &InstrumentationScope) -> SpanData {
    let context = |trace: [u8; 16], id: [u8; 8]| {
        SpanContext::new(
            TraceId::from_bytes(trace),
            SpanId::from_bytes(id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        )
    };
    let mut links = SpanLinks::default();
    links.links = span
        .links
        .iter()
        .map(|l| Link::with_context(context(l.trace_id, l.span_id)))
        .collect();
    SpanData {
        span_context: context(span.trace_id, span.span_id),
        parent_span_id: span.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: false,
        span_kind: match span.kind {
            SpanKind::Internal => opentelemetry::trace::SpanKind::Internal,
            SpanKind::Client => opentelemetry::trace::SpanKind::Client,
        },
        name: span.name.into(),
        start_time: system_time(span.start),
        end_time: system_time(span.end),
        attributes: span
            .attributes
            .into_iter()
            .map(|(key, value)| KeyValue::new(key, otel_value(value)))
            .collect(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links,
        status: match span.error {
            Some(message) => Status::error(message),
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

fn system_time(at: jiff::Timestamp) -> SystemTime {
    let nanos = u64::try_from(at.as_nanosecond()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
}

fn otel_value(value: Value) -> opentelemetry::Value {
    match value {
        Value::Str(s) => opentelemetry::Value::String(s.into()),
        Value::Int(n) => opentelemetry::Value::I64(n),
        Value::Strs(list) => opentelemetry::Value::Array(opentelemetry::Array::String(
            list.into_iter().map(StringValue::from).collect(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_url() {
        let options = OtlpOptions {
            endpoint: "http://collector:4318/".into(),
            content: Content::Off,
        };
        assert_eq!(options.traces_url(), "http://collector:4318/v1/traces");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let counters = Arc::new(SpanCounters::default());
        let (queue, _receiving) = mpsc::channel(1);
        let sink = OtlpSpans {
            queue,
            content: Content::Off,
            counters: counters.clone(),
        };
        let span = nodus_core::telemetry::run_span(
            &nodus_core::telemetry::RunContext {
                uid: "u".into(),
                project: "p".into(),
                run: "r".into(),
                agent: "a".into(),
                provider: "x".into(),
            },
            &nodus_core::telemetry::Ended {
                start: jiff::Timestamp::UNIX_EPOCH,
                end: jiff::Timestamp::UNIX_EPOCH,
                phase: "Succeeded",
                succeeded: true,
                cost: nodus_core::Usd::ZERO,
            },
            None,
        );
        for _ in 0..3 {
            sink.export(span.clone());
        }
        assert_eq!(counters.dropped_queue_full.load(Ordering::Relaxed), 2);
    }
}
