//! Human output: styles, aligned tables, times and sizes; and writing to stdout.
//!
//! Text is built with ANSI styles and written through `anstream`, which drops the styles when
//! stdout is not a terminal, when `NO_COLOR` is set, or with `--color never`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use anstyle::{AnsiColor, Effects, Style};
use loops_core::RunStatus;
use serde::Serialize;
use unicode_width::UnicodeWidthStr;

use crate::failure::{Failure, Result};

/// Column headers and field labels.
pub const HEADER: Style = Style::new().effects(Effects::BOLD);
/// Secondary text (times, hashes, previews).
pub const DIM: Style = Style::new().effects(Effects::DIMMED);
/// Errors.
pub const ERROR: Style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Red)));
/// Run ids and names the reader may copy.
pub const ID: Style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Cyan)));
/// Plain text.
pub const PLAIN: Style = Style::new();

/// The style a status is shown in.
pub fn status_style(status: RunStatus) -> Style {
    let color = match status {
        RunStatus::Running => AnsiColor::Blue,
        RunStatus::Waiting => AnsiColor::Yellow,
        RunStatus::Completed => AnsiColor::Green,
        RunStatus::Failed => AnsiColor::Red,
        RunStatus::Cancelled => AnsiColor::Magenta,
        RunStatus::Blocked => AnsiColor::Cyan,
    };
    Style::new().fg_color(Some(anstyle::Color::Ansi(color)))
}

/// `text` in `style`.
pub fn paint(style: Style, text: &str) -> String {
    if style == PLAIN || text.is_empty() {
        text.to_owned()
    } else {
        format!("{style}{text}{style:#}")
    }
}

/// One cell of a [`Table`].
#[derive(Debug, Clone)]
pub struct Cell {
    text: String,
    style: Style,
}

impl Cell {
    /// The text shown, before escaping and style.
    #[cfg(test)]
    pub fn text(&self) -> &str {
        &self.text
    }

    /// A cell showing `text` in `style`, its control characters (a line break, a tab, a
    /// terminal escape: stored text may hold them, from a store written before loops refused
    /// them, or in an error's text) and bidirectional controls escaped as Rust writes them
    /// (`\n`, `\u{1b}`, `\u{202e}`) before the table measures it: a cell is one line, and
    /// shows what is stored rather than acting on the terminal.
    pub fn new(text: impl Into<String>, style: Style) -> Self {
        let text = text.into();
        let escape = |c: char| c.is_control() || loops_core::is_bidi_control(c);
        if !text.chars().any(escape) {
            return Cell { text, style };
        }
        let mut shown = String::with_capacity(text.len() + 16);
        for c in text.chars() {
            if escape(c) {
                shown.extend(c.escape_debug());
            } else {
                shown.push(c);
            }
        }
        Cell { text: shown, style }
    }

    /// A cell showing `text` unstyled.
    pub fn plain(text: impl Into<String>) -> Self {
        Cell::new(text, PLAIN)
    }
}

/// Rows of cells, printed with every column aligned (two spaces between columns).
#[derive(Debug, Default)]
pub struct Table {
    header: Option<Vec<String>>,
    rows: Vec<Vec<Cell>>,
    min_widths: Vec<usize>,
}

impl Table {
    /// A table with a header row.
    pub fn with_header(header: &[&str]) -> Self {
        Table {
            header: Some(header.iter().map(|h| (*h).to_owned()).collect()),
            ..Table::default()
        }
    }

    /// A table without a header (label/value pairs).
    pub fn new() -> Self {
        Table::default()
    }

    /// This table, with its first columns at least `widths` wide (so that label columns line
    /// up from one output to the next).
    pub fn min_widths(self, widths: &[usize]) -> Self {
        Table {
            min_widths: widths.to_vec(),
            ..self
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in a newline; `indent` spaces before
    /// each line.
    pub fn render(&self, indent: usize) -> String {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain(self.header.as_ref().map(Vec::len))
            .max()
            .unwrap_or(0);
        let mut widths = vec![0; columns];
        for (w, min) in widths.iter_mut().zip(&self.min_widths) {
            *w = *min;
        }
        let header_cells: Option<Vec<Cell>> = self
            .header
            .as_ref()
            .map(|h| h.iter().map(|t| Cell::new(t.clone(), HEADER)).collect());
        for row in header_cells.iter().chain(&self.rows) {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.text.width());
            }
        }
        let mut out = String::new();
        for row in header_cells.iter().chain(&self.rows) {
            let mut line = " ".repeat(indent);
            // The last non-empty cell is not padded, so that lines carry no trailing blanks.
            let last = row.iter().rposition(|c| !c.text.is_empty()).unwrap_or(0);
            for (i, cell) in row.iter().enumerate().take(last + 1) {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(&paint(cell.style, &cell.text));
                if i < last {
                    line.push_str(&" ".repeat(widths[i] - cell.text.width()));
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

/// Writes `text` to stdout (styles dropped where colour is off). A closed pipe (`| head`) is
/// not an error.
pub fn emit(text: &str) -> Result<()> {
    let text = shown(text);
    let mut out = anstream::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::new(format!("cannot write to stdout: {e}"))),
    }
}

/// Writes `value` to stdout as pretty JSON, followed by a newline. Bidirectional control
/// characters are written as JSON escapes (`\u202e`): the same strings to a JSON reader, the
/// text in its own order on a terminal.
pub fn emit_json(value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::new(format!("cannot encode the output as JSON: {e}")))?;
    // They can only stand inside JSON strings, where an escape means the same character.
    let text = loops_core::replace_bidi_controls(&text, |c| format!("\\u{:04x}", u32::from(c)));
    emit(&format!("{text}\n"))
}

/// `text` with each bidirectional control character ([`loops_core::is_bidi_control`])
/// written as `\u{202e}`: text the CLI shows (payloads, reasons, run ids, errors) may hold
/// them, and a terminal would show the rest of the line in another order.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    loops_core::escape_bidi_controls(text)
}

/// Writes a one-line note to stderr (`note: ...`).
pub fn note(text: &str) {
    let style = Style::new().fg_color(Some(anstyle::Color::Ansi(AnsiColor::Yellow)));
    let _ = writeln!(
        anstream::stderr().lock(),
        "{}: {}",
        paint(style.effects(Effects::BOLD), "note"),
        shown(&crate::failure::one_line(text))
    );
}

/// The plural ending of a count: `""` for 1, `"s"` otherwise (`2 attempts`, `1 attempt`).
pub fn plural(n: impl TryInto<u64>) -> &'static str {
    if n.try_into().ok() == Some(1) {
        ""
    } else {
        "s"
    }
}

/// How many transitions a run's history of `records` transition records holds, as text
/// (`"1 transition"`, `"7 transitions"`): its first record is the run's creation, not a
/// transition, so a run that never moved has made none.
pub fn transitions(records: usize) -> String {
    let moves = records.saturating_sub(1);
    format!("{moves} transition{}", plural(moves))
}

/// The first time (ms since the Unix epoch) past what RFC 3339 can spell:
/// 10000-01-01T00:00:00Z.
const AFTER_YEAR_9999_MS: u64 = 253_402_300_800_000;

/// A time (`ms`, ms since the Unix epoch) as RFC 3339 in UTC with milliseconds
/// (`2026-05-01T10:00:00.123Z`); a time after year 9999, which RFC 3339 cannot spell (a sleep,
/// time-out or retry too long to count saturates to `u64::MAX` ms), as
/// [`far_time`]`(ms)`: `after year 9999 (18446744073709551615 ms since the Unix epoch)`.
pub fn rfc3339(ms: u64) -> String {
    if is_far(ms) {
        return far_time(ms);
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// How every output (text, `--json`, the web UI) shows a time (`ms`, ms since the Unix epoch)
/// after year 9999: `after year 9999 (ms ms since the Unix epoch)`.
fn far_time(ms: u64) -> String {
    format!("after year 9999 ({ms} ms since the Unix epoch)")
}

/// Whether `ms` (ms since the Unix epoch) is after year 9999.
fn is_far(ms: u64) -> bool {
    ms >= AFTER_YEAR_9999_MS
}

/// A time (`at`) as RFC 3339 and relative to `now` (both ms since the Unix epoch):
/// `2026-05-01T10:00:00.123Z (3s ago)`; a time after year 9999 only as [`rfc3339`] shows it.
pub fn when(at: u64, now: u64) -> String {
    if is_far(at) {
        return far_time(at);
    }
    format!("{} ({})", rfc3339(at), relative(at, now))
}

/// A time (`ms`) relative to `now_ms` (both ms since the Unix epoch): `5m ago`, `in 3h 10m`,
/// `just now`; a time after year 9999 as [`rfc3339`] shows it
/// (`after year 9999 (... ms since the Unix epoch)`).
pub fn relative(ms: u64, now_ms: u64) -> String {
    if is_far(ms) {
        far_time(ms)
    } else if ms.abs_diff(now_ms) < 1000 {
        "just now".to_owned()
    } else if ms <= now_ms {
        format!("{} ago", coarse(now_ms - ms))
    } else {
        format!("in {}", coarse(ms - now_ms))
    }
}

/// A span in at most two units, rounded down: `42s`, `5m 12s`, `3h 10m`, `12d 4h`.
pub fn coarse(ms: u64) -> String {
    let s = ms / 1000;
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if d > 0 {
        pair(d, "d", h % 24, "h")
    } else if h > 0 {
        pair(h, "h", m % 60, "m")
    } else if m > 0 {
        pair(m, "m", s % 60, "s")
    } else {
        format!("{s}s")
    }
}

fn pair(a: u64, ua: &str, b: u64, ub: &str) -> String {
    if b == 0 {
        format!("{a}{ua}")
    } else {
        format!("{a}{ua} {b}{ub}")
    }
}

/// A measured duration: `850ms`, `1.25s`, `42.0s`, then as [`coarse`].
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 10_000 {
        format!("{:.2}s", ms as f64 / 1000.0)
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        coarse(ms)
    }
}

/// A size in bytes for people: `1.20 MiB (1258291 bytes)`.
pub fn bytes(n: u64) -> String {
    format!("{} ({n} bytes)", indicatif::BinaryBytes(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history's first record is the run's creation: it counts one transition fewer.
    #[test]
    fn a_history_counts_its_moves() {
        assert_eq!(transitions(0), "0 transitions");
        assert_eq!(transitions(1), "0 transitions");
        assert_eq!(transitions(2), "1 transition");
        assert_eq!(transitions(8), "7 transitions");
    }

    /// A cell holding a bidirectional control is measured as it is printed, escaped: its
    /// column stays aligned.
    #[test]
    fn a_cell_with_a_bidi_control_keeps_its_column_aligned() {
        let mut t = Table::new();
        t.row(vec![Cell::plain("k\u{202e}"), Cell::plain("now")]);
        t.row(vec![Cell::plain("plain"), Cell::plain("then")]);
        assert_eq!(t.render(0), "k\\u{202e}  now\nplain      then\n");
    }

    #[test]
    fn times_and_spans() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            rfc3339(253_402_300_800_000),
            "after year 9999 (253402300800000 ms since the Unix epoch)"
        );
        assert_eq!(
            rfc3339(u64::MAX),
            "after year 9999 (18446744073709551615 ms since the Unix epoch)"
        );
        assert_eq!(
            relative(u64::MAX, 1_000),
            "after year 9999 (18446744073709551615 ms since the Unix epoch)"
        );
        assert_eq!(when(61_000, 1_000), "1970-01-01T00:01:01.000Z (in 1m)");
        assert_eq!(
            when(u64::MAX, 1_000),
            "after year 9999 (18446744073709551615 ms since the Unix epoch)"
        );
        assert_eq!(coarse(42_000), "42s");
        assert_eq!(coarse(5 * 60_000 + 12_000), "5m 12s");
        assert_eq!(coarse(3 * 3_600_000), "3h");
        assert_eq!(coarse(2 * 86_400_000 + 3_600_000), "2d 1h");
        assert_eq!(relative(1_000, 61_000), "1m ago");
        assert_eq!(relative(61_000, 1_000), "in 1m");
        assert_eq!(relative(5_000, 5_400), "just now");
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(1_250), "1.25s");
        assert_eq!(duration(42_000), "42.0s");
        assert_eq!(duration(61_000), "1m 1s");
    }

    #[test]
    fn tables_align_by_display_width_without_trailing_blanks() {
        let mut t = Table::with_header(&["A", "LONG HEADER", "C"]);
        t.row(vec![Cell::plain("x"), Cell::plain("y"), Cell::plain("")]);
        t.row(vec![
            Cell::plain("wide"),
            Cell::plain("漢字"),
            Cell::plain("z"),
        ]);
        let text = t.render(0);
        let plain: String = anstream::adapter::strip_str(&text).to_string();
        assert_eq!(
            plain,
            "A     LONG HEADER  C\nx     y\nwide  漢字         z\n"
        );
    }
}
