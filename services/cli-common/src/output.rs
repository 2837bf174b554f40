//! How the command line prints: plain aligned columns for people, one JSON value on stdout for programs.
//!
//! Text for people carries what producers wrote (holders, attributes, reasons, details, native ids, rejections
//! that echo them), so every piece of it is shown through [`leasehold_schemas::text`]: control and bidi characters
//! escaped, once, where the piece is put into its line. [`Table::row`] and [`fields`] take raw text and escape
//! each cell themselves, and align columns by the width the escaped cells take on a terminal (a CJK character
//! takes two columns). JSON output is never escaped: a value stays exact.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use leasehold_schemas::Outcome;
use leasehold_schemas::text::{escape_for_display, json_for_display, shown};
use serde::Serialize;
use unicode_width::UnicodeWidthStr;

pub use crate::zone::Zone;

/// `--output`: what a command prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns (or `field  value` lines for one record), for people.
    #[default]
    Table,
    /// One JSON object or array (`watch`: one compact object per line), for programs.
    Json,
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart; the last column is not padded.
/// Cells are raw text: each is escaped for display when it is added.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Table { headers: headers.to_vec(), rows: Vec::new() }
    }

    /// Adds a row of raw cells (escaped here: a cell never breaks its line or colours the terminal).
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len(), "a row has one cell per column");
        self.rows.push(cells.iter().map(|cell| escape_for_display(cell).into_owned()).collect());
    }

    pub fn render(&self) -> String {
        let n_columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| display_width(h)).collect();
        for row in &self.rows {
            for (idx, cell) in row.iter().enumerate().take(n_columns) {
                widths[idx] = widths[idx].max(display_width(cell));
            }
        }
        let mut out = String::new();
        let header_cells: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        for cells in std::iter::once(&header_cells).chain(&self.rows) {
            let mut line = String::new();
            for (idx, cell) in cells.iter().enumerate().take(n_columns) {
                if idx + 1 == n_columns {
                    line.push_str(cell);
                } else {
                    line.push_str(&pad(cell, widths[idx]));
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `field  value` lines for one record, the fields aligned; each value is raw text, escaped here.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(name, _)| display_width(name)).max().unwrap_or(0);
    let mut out = String::new();
    for (name, value) in pairs {
        out.push_str(&pad(name, width));
        out.push_str("  ");
        out.push_str(&escape_for_display(value));
        out.push('\n');
    }
    out
}

/// The columns `text` takes on a terminal (a CJK character or an emoji two, a combining mark none). Meant for text
/// already escaped for display, which holds no control character.
pub fn display_width(text: &str) -> usize {
    UnicodeWidthStr::width(text)
}

/// `text` with spaces after it up to `width` columns (as it is when it is that wide already).
pub fn pad(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len() + width);
    out.push_str(text);
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(display_width(text))));
    out
}

/// An error whose message its maker made safe to show (each piece of outside text in it escaped), so that it may
/// span lines: printed as it is, where other errors are escaped whole (see [`show_error`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShownError(pub String);

/// An error (one of a chain) as stderr shows it: escaped for display, unless it is a [`ShownError`] or `also_shown`
/// says its maker made it safe.
pub fn show_error(error: &(dyn std::error::Error + 'static), also_shown: bool) -> String {
    if also_shown || error.is::<ShownError>() { error.to_string() } else { shown(error).to_string() }
}

/// Whether anything was printed on stdout (with [`emit`]).
static EMITTED: AtomicBool = AtomicBool::new(false);
/// Whether a failure prints a JSON error on stdout (`--output json` of a producer or query command).
static JSON_ERRORS: AtomicBool = AtomicBool::new(false);
/// What the command line knows of what it is doing (`command_id`, `ref`, `lease`), for a JSON error.
static KNOWN: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());

/// A producer or query command runs with `format`: with JSON, a failure that printed nothing yet prints one JSON
/// error (see [`emit_error`]).
pub fn errors_as(format: OutputFormat) {
    JSON_ERRORS.store(format == OutputFormat::Json, Ordering::Relaxed);
}

/// Notes a fact a JSON error carries: the command id chosen, the reference of what it makes.
pub fn know(field: &'static str, value: impl ToString) {
    KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(field, value.to_string());
}

/// `{"error": <message>, ...what is known}`
pub fn error_value(message: &str) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("error".to_owned(), message.into());
    for (field, value) in KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
        map.insert((*field).to_owned(), value.clone().into());
    }
    serde_json::Value::Object(map)
}

/// With `--output json`, a failure that printed nothing on stdout prints `{"error": ..., ...what is known}` there
/// (the message goes on stderr as well), so that stdout holds one JSON value on every exit path.
pub fn emit_error(error: &anyhow::Error) {
    if JSON_ERRORS.load(Ordering::Relaxed) && !EMITTED.load(Ordering::Relaxed) {
        let value = error_value(&format!("{error:#}"));
        if let Ok(text) = json(&value) {
            emit(&text);
        }
    }
}

/// Writes `text` to stdout. A closed stdout (`leasehold watch | head`) ends the process quietly, as other command
/// line tools do.
pub fn emit(text: &str) {
    use std::io::Write as _;
    EMITTED.store(true, Ordering::Relaxed);
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("leasehold: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// How times are shown to people: in a zone (this machine's), and against a "now" (this machine's clock) for "12 min
/// ago" and "in 5 min". Renderers take one, so that a test renders with a fixed one (UTC, a fixed now) and a golden
/// file does not depend on the machine it runs on. JSON output keeps unix milliseconds: this is for text only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    /// Unix ms.
    pub now: u64,
    pub zone: Zone,
}

impl Clock {
    /// This machine's clock and zone.
    pub fn system() -> Clock {
        Clock { now: now_ms(), zone: Zone::local() }
    }

    /// A fixed now (unix ms) in a fixed zone.
    pub fn fixed(now: u64, zone: Zone) -> Clock {
        Clock { now, zone }
    }

    /// Unix ms as RFC 3339 to the second in the zone (`2026-01-01T14:05:00+01:00`); `-` for none.
    pub fn time(&self, ms: Option<u64>) -> String {
        ms.map_or_else(|| "-".to_owned(), |ms| self.zone.rfc3339(ms))
    }

    /// How far from now, in a few words: "40 s ago", "12 min ago", "3 h 5 min ago", "in 5 min"; `-` for none.
    pub fn ago(&self, ms: Option<u64>) -> String {
        ms.map_or_else(|| "-".to_owned(), |ms| relative(self.now, ms))
    }

    /// Both: `2026-01-01T14:05:00+01:00 (12 min ago)`; `-` for none.
    pub fn when(&self, ms: Option<u64>) -> String {
        ms.map_or_else(|| "-".to_owned(), |ms| format!("{} ({})", self.zone.rfc3339(ms), relative(self.now, ms)))
    }

    /// The local time of day and how far from now: `14:05 (in 5 min)`; the whole date when it is not within a day.
    pub fn short(&self, ms: u64) -> String {
        if self.now.abs_diff(ms) < 20 * 3_600_000 {
            format!("{} ({})", self.zone.clock(ms), relative(self.now, ms))
        } else {
            format!("{} ({})", self.zone.rfc3339(ms), relative(self.now, ms))
        }
    }
}

impl Clock {
    /// `text` (a server's words, such as "w1 last heard from 2026-01-01T00:09:50.000Z") with every RFC 3339 time in
    /// UTC in it (`...Z`, to the second or the millisecond) shown in this clock's zone.
    pub fn localize(&self, text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = String::with_capacity(text.len());
        let mut idx = 0;
        while idx < bytes.len() {
            if let Some((ms, len)) = utc_stamp_at(&bytes[idx..]) {
                out.push_str(&self.zone.rfc3339(ms));
                idx += len;
            } else {
                let c = text[idx..].chars().next().expect("a char at a char boundary");
                out.push(c);
                idx += c.len_utf8();
            }
        }
        out
    }
}

/// A time `YYYY-MM-DDTHH:MM:SS[.mmm]Z` at the start of `bytes`: its unix ms and its length.
fn utc_stamp_at(bytes: &[u8]) -> Option<(u64, usize)> {
    let digits = |range: std::ops::Range<usize>| -> Option<u64> {
        let part = bytes.get(range)?;
        part.iter().all(u8::is_ascii_digit).then(|| part.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let punct = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if !punct.iter().all(|(at, c)| bytes.get(*at) == Some(c)) {
        return None;
    }
    let len = match bytes.get(19) {
        Some(b'Z') => 20,
        Some(b'.') if bytes.get(23) == Some(&b'Z') && digits(20..23).is_some() => 24,
        _ => return None,
    };
    let ms = crate::zone::parse_utc(std::str::from_utf8(&bytes[..len]).ok()?)?;
    Some((ms, len))
}

/// This machine's clock, in unix ms.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `ms` from `now` in a few words: past ("12 min ago", "just now") or future ("in 5 min").
fn relative(now: u64, ms: u64) -> String {
    let span = |secs: u64| match secs {
        0..90 => format!("{secs} s"),
        90..5_400 => format!("{} min", (secs + 30) / 60),
        5_400..172_800 => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
        _ => format!("{} d {} h", secs / 86_400, secs % 86_400 / 3600),
    };
    match ms.saturating_sub(now) / 1000 {
        0 if ms > now => "just now".to_owned(),
        0 => format!("{} ago", span(now.saturating_sub(ms) / 1000)),
        ahead => format!("in {}", span(ahead)),
    }
}

/// Pretty JSON of `value`, with a final newline.
pub fn json(value: &impl Serialize) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

/// A duration in ms as `5min`, `30s`, `1500ms`; `-` for none.
pub fn duration(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_owned(), |ms| leasehold_schemas::Millis(ms).to_string())
}

/// An optional value, `-` for none.
pub fn opt(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A JSON value for a table cell: strings without quotes, `null` as `-`, anything else compact.
pub fn cell(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// An effect as `name {its fields}` (its JSON form, without the outer object): exact, for JSON output. To show
/// it to people, [`shown_effect`].
pub fn effect(effect: &leasehold_schemas::Effect) -> String {
    effect.as_text()
}

/// [`effect`] made safe to show: its JSON with every control and bidi character a JSON escape (the same value).
pub fn shown_effect(effect: &leasehold_schemas::Effect) -> String {
    json_for_display(&self::effect(effect)).into_owned()
}

/// One line for an outcome on the log: sequence, log time (in `clock`'s zone), key, command type, issuer, then what
/// was decided; every piece escaped for display.
pub fn outcome_line(seq: u64, outcome: &Outcome, clock: &Clock) -> String {
    let head = format!(
        "{seq}  {}  {}  {}  {}  {}",
        clock.time(Some(outcome.log_time.0)),
        outcome.command.key.token(),
        shown(&outcome.command.type_name),
        shown(&outcome.command.issuer),
        outcome.command.id,
    );
    match outcome.rejection() {
        Some(rejection) => format!("{head}  rejected {}: {}", rejection.kind, shown(&rejection.message)),
        None => {
            let effects: Vec<String> = outcome
                .positioned_effects()
                .map(|(position, e)| format!("{} {}", position.0, shown_effect(e)))
                .collect();
            format!("{head}  accepted: {}", effects.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_a_few_words() {
        let now = 1_767_225_600_000;
        for (ago, said) in [
            (0, "0 s ago"),
            (400, "0 s ago"),
            (40_000, "40 s ago"),
            (12 * 60_000 + 10_000, "12 min ago"),
            (3 * 3_600_000 + 5 * 60_000, "3 h 5 min ago"),
            (2 * 86_400_000 + 4 * 3_600_000, "2 d 4 h ago"),
        ] {
            assert_eq!(relative(now, now - ago), said);
        }
        assert_eq!(relative(now, now + 5 * 60_000), "in 5 min");
        assert_eq!(relative(now, now + 400), "just now");
        let clock = Clock::fixed(now, Zone::fixed(3600));
        assert_eq!(clock.when(Some(now - 720_000)), "2026-01-01T00:48:00+01:00 (12 min ago)");
        assert_eq!(clock.short(now + 300_000), "01:05 (in 5 min)");
        assert_eq!(clock.short(now + 3 * 86_400_000), "2026-01-04T01:00:00+01:00 (in 3 d 0 h)");
        assert_eq!((clock.time(None), clock.ago(None)), ("-".to_owned(), "-".to_owned()));
        assert_eq!(
            clock.localize(
                "w1 last heard from 2026-01-01T00:09:50.000Z, gone at 2026-01-01T00:00:01Z; 2026-13-01T00:00:00Z"
            ),
            "w1 last heard from 2026-01-01T01:09:50+01:00, gone at 2026-01-01T01:00:01+01:00; 2026-13-01T00:00:00Z"
        );
        assert_eq!(clock.localize("漢字 no time"), "漢字 no time");
    }

    #[test]
    fn table_aligns_columns_and_leaves_the_last_one_unpadded() {
        let mut table = Table::new(&["REF", "STATE", "KIND"]);
        table.row(vec!["w1.a".into(), "pending".into(), "container".into()]);
        table.row(vec!["w22.bbbb".into(), "active".into(), "-".into()]);
        assert_eq!(
            table.render(),
            "REF       STATE    KIND\n\
             w1.a      pending  container\n\
             w22.bbbb  active   -\n"
        );
    }

    #[test]
    fn cells_are_escaped_and_columns_aligned_by_the_width_they_take() {
        let mut table = Table::new(&["HOLDER", "STATE", "WHY"]);
        table.row(vec!["x\u{1b}[31mRED\rFAKE".into(), "active".into(), "-".into()]);
        table.row(vec!["漢字ビルド".into(), "wait\u{202e}ing".into(), "a\nb".into()]);
        table.row(vec!["🦀".into(), "-".into(), "-".into()]);
        assert_eq!(
            table.render(),
            "HOLDER              STATE            WHY\n\
             x\\x1b[31mRED\\rFAKE  active           -\n\
             漢字ビルド          wait\\u{202e}ing  a\\nb\n\
             🦀                  -                -\n"
        );
        // Every line is as wide, column by column, on a terminal.
        let text = table.render();
        let starts: Vec<usize> = text.lines().map(|l| display_width(&l[..l.rfind("  ").unwrap()])).collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{starts:?}\n{text}");
    }

    #[test]
    fn widths_count_terminal_columns() {
        assert_eq!(display_width("abc"), 3);
        assert_eq!(display_width("漢字"), 4);
        assert_eq!(display_width("é"), 1);
        assert_eq!(display_width("e\u{301}"), 1);
        assert_eq!(display_width("🦀"), 2);
        assert_eq!(pad("漢字", 6), "漢字  ");
        assert_eq!(pad("abcdef", 3), "abcdef");
    }

    #[test]
    fn field_values_are_escaped() {
        assert_eq!(
            fields(&[("holder", "x\u{1b}[31mRED\rFAKE".into()), ("detail", "a\u{202e}b\nc".into())]),
            "holder  x\\x1b[31mRED\\rFAKE\ndetail  a\\u{202e}b\\nc\n"
        );
    }

    #[test]
    fn an_outcome_line_shows_what_producers_wrote_escaped() {
        let outcome = |decision: serde_json::Value| -> Outcome {
            serde_json::from_value(serde_json::json!({
                "decider_version": 1, "partition": 5,
                "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.acquire",
                            "issuer": "cli", "issued_at": 1767225601000u64, "key": "w1"},
                "cmd_seq": 3, "part": 0, "log_time": 1767225601007u64, "decided_at": 1767225601007u64,
                "decision": decision
            }))
            .unwrap()
        };
        let granted = outcome(serde_json::json!({"accepted": {"first_position": 10, "effects": [
            {"lease-granted": {"lease": "019b76da-9860-7333-b333-333333333333",
                "resource": "019b76da-9478-7111-9111-111111111111", "holder": "x\u{1b}[31mRED\rFAKE\u{202e}",
                "ttl": null, "expires_at": null}}
        ]}}));
        let clock = Clock::fixed(1_767_225_601_007, Zone::utc());
        let line = outcome_line(7, &granted, &clock);
        assert!(!line.contains(leasehold_schemas::text::is_unsafe_for_display), "{line:?}");
        assert!(line.contains(r#""holder":"x\u001b[31mRED\rFAKE\u202e""#), "{line}");
        let rejected =
            outcome(serde_json::json!({"rejected": {"kind": "invalid-state", "message": "holder x\u{1b}[2J\n7 FAKE"}}));
        let line = outcome_line(8, &rejected, &clock);
        assert!(line.ends_with(r"rejected invalid-state: holder x\x1b[2J\n7 FAKE"), "{line}");
    }

    #[test]
    fn an_empty_table_is_its_header() {
        assert_eq!(Table::new(&["NAME", "STATUS"]).render(), "NAME  STATUS\n");
    }

    #[test]
    fn fields_align_names() {
        assert_eq!(fields(&[("ref", "w1.a".into()), ("capacity", "2".into())]), "ref       w1.a\ncapacity  2\n");
    }

    #[test]
    fn times_and_durations_read_like_the_log() {
        let clock = Clock::fixed(1_767_225_601_000, Zone::utc());
        assert_eq!(clock.time(Some(1_767_225_601_000)), "2026-01-01T00:00:01Z");
        assert_eq!(duration(Some(300_000)), "5min");
    }

    #[test]
    fn effects_print_their_name_and_fields() {
        let released: leasehold_schemas::Effect =
            serde_json::from_str(r#"{"lease-released": {"lease": "019b76da-9860-7333-b333-333333333333"}}"#).unwrap();
        assert_eq!(effect(&released), r#"lease-released {"lease":"019b76da-9860-7333-b333-333333333333"}"#);
        let recovered: leasehold_schemas::Effect = serde_json::from_str(r#"{"agent-recovered": {}}"#).unwrap();
        assert_eq!(effect(&recovered), "agent-recovered");
    }

    #[test]
    fn an_error_carries_what_is_known() {
        know("command_id", "019b76da-abe8-7001-8000-000000000001");
        let value = error_value("the gateway refused it");
        assert_eq!(value["error"], "the gateway refused it");
        assert_eq!(value["command_id"], "019b76da-abe8-7001-8000-000000000001");
    }

    #[test]
    fn cells_show_strings_bare_and_null_as_a_dash() {
        assert_eq!(cell(&serde_json::json!("w1")), "w1");
        assert_eq!(cell(&serde_json::json!(null)), "-");
        assert_eq!(cell(&serde_json::json!(3)), "3");
    }
}
