//! The logs of leasehold's processes (`serve`, `agent run`, `leasehold-replay`): tracing's fmt layer on stderr, with
//! one formatter of fields that escapes every value and message for display. Log fields quote what producers wrote
//! (holders, reasons, details, the gateway's refusals) and errors that echo it; escaped in one place, no `info!` can
//! write a raw control or bidi character to a terminal or a log file, however it records its value (`%`, `?`, a
//! `&str`, the message), and a multi-line message stays on its line.

use std::fmt;

use leasehold_schemas::text::{escape_for_display, shown};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// Logs go to stderr, filtered by `RUST_LOG` (else `default_filter`, e.g. `info`), coloured only on a terminal (logs
/// captured to a file stay plain text), every field escaped by [`EscapedFields`].
pub fn init(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .fmt_fields(EscapedFields)
        .init();
}

/// Formats an event's or a span's fields as tracing's default does (`message name=value name="text"`), every value
/// escaped with [`leasehold_schemas::text::escape_for_display`]: strings quoted (a `"` inside as `\"`), `%` and `?`
/// values as they display, escaped. Field names are the code's own. With ANSI on, names are italic and `=` dimmed,
/// as tracing's own colours go.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor { writer, first: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'writer> {
    writer: Writer<'writer>,
    /// No field written yet (no space before the next).
    first: bool,
    result: fmt::Result,
}

impl EscapingVisitor<'_> {
    /// Writes `name=value` (or the bare message), `value` already escaped.
    fn write(&mut self, field: &Field, value: &str) {
        let name = field.name();
        // Metadata of events from the `log` crate, which the event formatter has shown already.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = (|| {
            if !std::mem::take(&mut self.first) {
                self.writer.write_char(' ')?;
            }
            if name == "message" {
                return self.writer.write_str(value);
            }
            if self.writer.has_ansi_escapes() {
                write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m{value}")
            } else {
                write!(self.writer, "{name}={value}")
            }
        })();
    }
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, &escape_for_display(value));
        } else {
            let quoted = format!("\"{}\"", escape_for_display(value).replace('"', "\\\""));
            self.write(field, &quoted);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &shown(format_args!("{value:?}")).to_string());
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a subscriber with [`EscapedFields`] writes for the events `log` makes, with ANSI on or off.
    fn logged(ansi: bool, log: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(ansi)
            .without_time()
            .with_target(false)
            .fmt_fields(EscapedFields)
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    const HOLDER: &str = "x\u{1b}[31mRED\rFAKE\u{202e}";

    #[test]
    fn every_kind_of_field_is_escaped() {
        #[derive(Debug)]
        #[allow(dead_code)] // read through Debug only
        struct Lease {
            holder: String,
        }
        let text = logged(false, || {
            let error = std::io::Error::other(format!("refused {HOLDER}\nsecond line"));
            tracing::info!(
                display = %HOLDER,
                debug = ?Lease { holder: "a\u{9b}b".to_owned() },
                text = HOLDER,
                quote = "say \"hi\"",
                error = &error as &(dyn std::error::Error + 'static),
                seq = 7,
                "acquired by {HOLDER}\nFAKE line"
            );
        });
        assert!(!text.trim_end().contains(leasehold_schemas::text::is_unsafe_for_display), "{text:?}");
        assert_eq!(text.lines().count(), 1, "one event, one line: {text:?}");
        assert_eq!(
            text,
            " INFO acquired by x\\x1b[31mRED\\rFAKE\\u{202e}\\nFAKE line display=x\\x1b[31mRED\\rFAKE\\u{202e} \
             debug=Lease { holder: \"a\\\\u{9b}b\" } text=\"x\\x1b[31mRED\\rFAKE\\u{202e}\" quote=\"say \\\"hi\\\"\" \
             error=refused x\\x1b[31mRED\\rFAKE\\u{202e}\\nsecond line seq=7\n"
        );
    }

    #[test]
    fn span_fields_are_escaped_too() {
        let text = logged(false, || {
            let span = tracing::info_span!("acquire", holder = %HOLDER);
            let _entered = span.enter();
            tracing::warn!("refused");
        });
        assert!(text.contains("acquire{holder=x\\x1b[31mRED\\rFAKE\\u{202e}}: refused"), "{text:?}");
    }

    #[test]
    fn tracing_colours_stay_and_values_are_escaped() {
        let text = logged(true, || tracing::info!(holder = %HOLDER, "acquired"));
        // The level is coloured and the name italic (escape sequences of tracing's own) ...
        assert!(text.contains("\u{1b}[32m INFO\u{1b}[0m"), "{text:?}");
        assert!(text.contains("\u{1b}[3mholder\u{1b}[0m\u{1b}[2m=\u{1b}[0mx\\x1b[31mRED\\rFAKE\\u{202e}"), "{text:?}");
        // ... and none of the holder's.
        assert!(!text.contains("\u{1b}[31m"), "{text:?}");
        assert!(!text.contains('\r') && !text.contains('\u{202e}'), "{text:?}");
    }
}
