//! `--logging-format`: tracing's text (the default), or one JSON object per line with the
//! field names Kubernetes components use with `--logging-format=json`, so a log pipeline reads
//! ours as it reads theirs: `ts` (seconds since the epoch, fractional), `caller` (`file:line`),
//! `msg`, `v` (the verbosity: 0 for info and warnings, 4 for debug, 5 for trace; absent on an
//! error, as Kubernetes writes errors), then the event's own key/values, an `error` field as
//! `err`.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `--logging-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LoggingFormat {
    /// tracing's text lines (coloured only on a terminal).
    #[default]
    Text,
    /// One JSON object per line, Kubernetes' field names.
    Json,
}

/// The keys of a line that an event's own fields never take; a field of one of these names is
/// written with a `field.` prefix.
const RESERVED: [&str; 5] = ["ts", "caller", "msg", "v", "err"];

/// Collects an event's message and fields as JSON values, in the order they were recorded.
#[derive(Default)]
struct Fields {
    msg: String,
    fields: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => {
                self.msg = match value {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
            }
            "error" => self.fields.push(("err".to_owned(), value)),
            name if RESERVED.contains(&name) => self.fields.push((format!("field.{name}"), value)),
            name => self.fields.push((name.to_owned(), value)),
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields arrive here as Display: their text, unquoted.
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
}

/// Kubernetes' verbosity for a level; `None` for an error, which carries none.
fn verbosity(level: Level) -> Option<u8> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(5),
    }
}

/// One log line (without its newline).
fn line(level: Level, caller: Option<String>, fields: Fields, at: SystemTime) -> String {
    let ts = at
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    // Written by hand, not through serde_json's map (which sorts its keys): ts, caller, msg
    // and v come first, as Kubernetes writes them.
    let mut seen = std::collections::HashSet::new();
    let mut head = format!("{{\"ts\":{}", Value::from(ts));
    if let Some(caller) = caller {
        head.push_str(&format!(",\"caller\":{}", Value::String(caller)));
    }
    head.push_str(&format!(",\"msg\":{}", Value::String(fields.msg)));
    if let Some(v) = verbosity(level) {
        head.push_str(&format!(",\"v\":{v}"));
    }
    for (key, value) in fields.fields {
        // A repeated key keeps its first value: a line never has the same key twice.
        if seen.insert(key.clone()) {
            head.push_str(&format!(",{}:{}", Value::String(key), value));
        }
    }
    head.push('}');
    head
}

/// The JSON line format of `--logging-format=json`.
#[derive(Debug, Default)]
pub struct KubeJson;

impl<S, N> FormatEvent<S, N> for KubeJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let caller = meta
            .file()
            .map(|f| format!("{f}:{}", meta.line().unwrap_or_default()));
        writeln!(
            writer,
            "{}",
            line(*meta.level(), caller, fields, SystemTime::now())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(msg: &str, kv: &[(&str, Value)]) -> Fields {
        Fields {
            msg: msg.to_owned(),
            fields: kv
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn a_line_has_kubernetes_field_names_in_their_order_and_parses_as_json() {
        let at = UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_250);
        let text = line(
            Level::INFO,
            Some("crates/node/src/lib.rs:42".into()),
            fields(
                "virtual node running",
                &[("node", Value::from("vk")), ("pods", Value::from(3))],
            ),
            at,
        );
        assert_eq!(
            text,
            "{\"ts\":1700000000.25,\"caller\":\"crates/node/src/lib.rs:42\",\
             \"msg\":\"virtual node running\",\"v\":0,\"node\":\"vk\",\"pods\":3}"
        );
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["msg"], "virtual node running");
    }

    #[test]
    fn errors_carry_no_verbosity() {
        let f = fields("gave up", &[("err", Value::from("refused"))]);
        let parsed: Value = serde_json::from_str(&line(Level::ERROR, None, f, UNIX_EPOCH)).unwrap();
        assert_eq!(parsed["err"], "refused");
        assert!(parsed.get("v").is_none());
        assert!(parsed.get("caller").is_none());
        assert_eq!(verbosity(Level::DEBUG), Some(4));
    }

    /// Through tracing itself: what the macros record is what the line says.
    #[test]
    fn events_from_the_macros_are_lines_of_json() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(KubeJson)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let e = std::io::Error::other("refused");
            tracing::info!(node = %"vk", count = 2_u64, ok = true, "started");
            tracing::warn!(error = %e, "retrying");
            tracing::error!(
                error = &e as &dyn std::error::Error,
                msg = "mine",
                "gave up"
            );
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["msg"], "started");
        assert_eq!(lines[0]["node"], "vk");
        assert_eq!(lines[0]["count"], 2);
        assert_eq!(lines[0]["ok"], true);
        assert_eq!(lines[0]["v"], 0);
        assert!(lines[0]["caller"].as_str().unwrap().contains("logging.rs:"));
        assert_eq!(lines[1]["err"], "refused");
        assert_eq!(lines[2]["err"], "refused");
        assert!(lines[2].get("v").is_none());
        assert_eq!(lines[2]["msg"], "gave up");
        assert_eq!(lines[2]["field.msg"], "mine");
    }
}
