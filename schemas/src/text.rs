//! How free text from commands is shown to people: holders, attributes, reasons, details, native ids and the
//! messages that echo them reach terminals, log files and error bodies, where a control character would colour the
//! screen, move the cursor or forge a row, and a bidi control would reorder what is read. [`escape_for_display`]
//! makes such text visible and unambiguous; every table, text line, log field and error message of leasehold that
//! carries text it did not write goes through it (JSON output does not: a JSON value stays exact).
//!
//! What is escaped, and how:
//!
//! | characters | shown as |
//! |---|---|
//! | `\` | `\\` (so an escaped form cannot be forged by typing it) |
//! | newline, carriage return, tab | `\n`, `\r`, `\t` |
//! | the other C0 controls (U+0000–U+001F) and DEL (U+007F) | `\x00` ... `\x1f`, `\x7f` |
//! | the C1 controls (U+0080–U+009F; U+009B is a one-byte CSI on some terminals) | `\u{80}` ... `\u{9f}` |
//! | bidi embeddings and overrides U+202A–U+202E, isolates U+2066–U+2069 | `\u{202e}` ... |
//! | bidi marks U+200E, U+200F, U+061C | `\u{200e}` ... |
//! | line and paragraph separators U+2028, U+2029 | `\u{2028}`, `\u{2029}` |
//!
//! The bidi marks do not override a direction the way U+202E does, but they are invisible and reorder the neutral
//! characters around them, so two values that differ only by marks would look the same; the separators break lines
//! in some viewers. Everything else is left as it is: letters of every script, CJK, emoji and their joiners
//! (U+200D), combining marks. Look-alike letters and zero-width spaces are a question of whom to trust, not of what
//! the terminal does, and are not this module's business.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// Whether `c` is shown escaped by [`escape_for_display`] as a character a terminal or a reader would act on
/// (everything it escapes but the backslash).
pub fn is_unsafe_for_display(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        | '\u{200e}' | '\u{200f}' | '\u{061c}'
        | '\u{2028}' | '\u{2029}')
}

/// `text` made safe to show on a terminal or in a log: see the module's table. Text with nothing to escape is
/// returned as it is, without a copy.
pub fn escape_for_display(text: &str) -> Cow<'_, str> {
    match text.find(|c: char| c == '\\' || is_unsafe_for_display(c)) {
        None => Cow::Borrowed(text),
        Some(first) => {
            let mut out = String::with_capacity(text.len() + 8);
            out.push_str(&text[..first]);
            let mut writer = Escaping(&mut out);
            // Writing into a String cannot fail.
            let _ = writer.write_str(&text[first..]);
            Cow::Owned(out)
        }
    }
}

/// `value`'s `Display` form escaped as [`escape_for_display`] escapes it, written as it is formatted (no copy):
/// `format!("rejected: {}", shown(&message))`. The alternate flag is passed on (`{:#}` of an `anyhow::Error` is its
/// chain of causes).
pub fn shown<T: fmt::Display>(value: T) -> Shown<T> {
    Shown(value)
}

/// See [`shown`].
#[derive(Debug, Clone, Copy)]
pub struct Shown<T>(pub T);

impl<T: fmt::Display> fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() { write!(Escaping(f), "{:#}", self.0) } else { write!(Escaping(f), "{}", self.0) }
    }
}

/// Writes what it is given escaped for display into the writer it wraps.
struct Escaping<W>(W);

impl<W: fmt::Write> fmt::Write for Escaping<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(|c: char| c == '\\' || is_unsafe_for_display(c)) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().expect("found at a char boundary");
            match c {
                '\\' => self.0.write_str("\\\\")?,
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c if (c as u32) < 0x80 => write!(self.0, "\\x{:02x}", c as u32)?,
                c => write!(self.0, "\\u{{{:x}}}", c as u32)?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// JSON text (as serde_json writes it) made safe to show, and still JSON of the same value: the characters
/// [`is_unsafe_for_display`] names that serde_json leaves raw in strings (DEL, C1, bidi controls and marks, the
/// separators) are written as JSON escapes, `\u202e`. Its backslashes are JSON's own and stay single. Only for JSON
/// text on one line: text that is not JSON goes through [`escape_for_display`].
pub fn json_for_display(json: &str) -> Cow<'_, str> {
    if !json.contains(is_unsafe_for_display) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 12);
    for c in json.chars() {
        if is_unsafe_for_display(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_character_is_shown_as_the_table_says() {
        let cases: &[(&str, &str)] = &[
            // Left alone.
            ("build-42", "build-42"),
            ("é ü ß", "é ü ß"),
            ("漢字テスト", "漢字テスト"),
            ("🦀 👩\u{200d}💻", "🦀 👩\u{200d}💻"),
            ("שלום abc", "שלום abc"),
            ("a b\u{a0}c", "a b\u{a0}c"),
            ("", ""),
            // The backslash, so that `\x1b` typed by hand is not read as an escape.
            ("a\\b", "a\\\\b"),
            ("\\x1b", "\\\\x1b"),
            // C0.
            ("x\u{1b}[31mRED\rFAKE", "x\\x1b[31mRED\\rFAKE"),
            ("a\nb\tc", "a\\nb\\tc"),
            ("\u{0}\u{7}\u{8}\u{c}\u{1f}", "\\x00\\x07\\x08\\x0c\\x1f"),
            // DEL and C1.
            ("\u{7f}", "\\x7f"),
            ("\u{80}\u{85}\u{9b}31m\u{9f}", "\\u{80}\\u{85}\\u{9b}31m\\u{9f}"),
            // Bidi controls, marks and separators.
            ("user\u{202e}gpj.exe", "user\\u{202e}gpj.exe"),
            ("\u{202a}\u{202b}\u{202c}\u{202d}", "\\u{202a}\\u{202b}\\u{202c}\\u{202d}"),
            ("\u{2066}\u{2067}\u{2068}\u{2069}", "\\u{2066}\\u{2067}\\u{2068}\\u{2069}"),
            ("\u{200e}\u{200f}\u{61c}", "\\u{200e}\\u{200f}\\u{61c}"),
            ("a\u{2028}b\u{2029}", "a\\u{2028}b\\u{2029}"),
            // Just outside the ranges.
            ("\u{a0}\u{2029}\u{202f}\u{2065}\u{206a}", "\u{a0}\\u{2029}\u{202f}\u{2065}\u{206a}"),
        ];
        for (raw, shown_as) in cases {
            assert_eq!(escape_for_display(raw), *shown_as, "{raw:?}");
            assert_eq!(shown(raw).to_string(), *shown_as, "{raw:?} through shown()");
        }
    }

    #[test]
    fn text_with_nothing_to_escape_is_not_copied() {
        assert!(matches!(escape_for_display("w1.019b76da 漢字 🦀"), Cow::Borrowed(_)));
        assert!(matches!(escape_for_display("a\u{1b}"), Cow::Owned(_)));
    }

    #[test]
    fn no_two_texts_are_shown_alike() {
        // The escaped forms are what typing them by hand gives: they stay apart from the characters they stand for.
        let texts = ["\u{1b}", "\\x1b", "\\\u{1b}", "\n", "\\n", "\u{202e}", "\\u{202e}"];
        let shown: std::collections::BTreeSet<_> = texts.iter().map(|t| escape_for_display(t)).collect();
        assert_eq!(shown.len(), texts.len(), "{shown:?}");
    }

    #[test]
    fn shown_passes_the_alternate_flag_on() {
        struct Chain;
        impl fmt::Display for Chain {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                if f.alternate() { f.write_str("outer: in\u{1b}ner") } else { f.write_str("outer") }
            }
        }
        assert_eq!(format!("{:#}", shown(Chain)), "outer: in\\x1bner");
        assert_eq!(format!("{}", shown(Chain)), "outer");
    }

    #[test]
    fn json_stays_json_of_the_same_value() {
        let value = serde_json::json!({"holder": "x\u{1b}[31m\u{9b}\u{202e}\u{7f}\\ \"q\" 漢字"});
        let json = serde_json::to_string(&value).unwrap();
        let shown = json_for_display(&json);
        assert_eq!(shown, r#"{"holder":"x\u001b[31m\u009b\u202e\u007f\\ \"q\" 漢字"}"#);
        assert!(!shown.contains(is_unsafe_for_display), "{shown}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).unwrap(), value);
        assert!(matches!(json_for_display(r#"{"a":"b\\c"}"#), Cow::Borrowed(_)));
    }
}
