//! The log lines of a test binary, as text, from every thread: one global `tracing`
//! subscriber at DEBUG, installed once ([`captured`]). A subscriber set per test with
//! `set_default` sees only its own thread, and lost lines under load while the binary's other
//! tests set and dropped theirs (the callsites' interest is cached process-wide), so tests
//! share this one and tell their lines apart by run id.

use std::sync::{Arc, Mutex, OnceLock};

/// Everything the subscriber wrote.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Everything logged so far, by any test of the binary.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The lines logged so far that name `run_id` as a field (`run_id="ID"` in a span's or
    /// an event's fields, or `run_id=ID`), each ending in a newline.
    #[allow(dead_code)] // not every test binary that includes this module picks lines by run
    pub fn of(&self, run_id: &str) -> String {
        let quoted = format!("run_id=\"{run_id}\"");
        let bare = format!("run_id={run_id}");
        let names = |line: &str| {
            line.contains(&quoted)
                || line.match_indices(&bare).any(|(at, _)| {
                    line[at + bare.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| c.is_whitespace() || c == '}')
                })
        };
        let mut out = String::new();
        for line in self.text().lines().filter(|l| names(l)) {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// How many lines hold both `word` and `run` (anywhere in the line: a run id no other
    /// test of the binary uses).
    #[allow(dead_code)] // not every test binary that includes this module counts lines
    pub fn matching(&self, word: &str, run: &str) -> usize {
        self.text()
            .lines()
            .filter(|l| l.contains(word) && l.contains(run))
            .count()
    }
}

/// The binary's log lines at DEBUG and above; installs the global subscriber on first call.
///
/// # Panics
/// If another global subscriber was installed first.
pub fn captured() -> &'static Lines {
    static LINES: OnceLock<Lines> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer({
                let lines = lines.clone();
                move || lines.clone()
            })
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        lines
    })
}
