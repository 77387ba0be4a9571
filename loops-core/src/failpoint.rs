//! Fault points on the commit path (cargo feature `failpoints`, off by default).
//!
//! With the feature on, a test process calls `fail::FailScenario::setup()` and sets
//! `FAILPOINTS="<name>=return"` (or `"<name>=2*off->return"` to let two passes through) to
//! make the process abort at that point, as a crash would stop it. Without the feature the
//! points compile to nothing.
//!
//! | name | where |
//! |---|---|
//! | `loops::step::before_effect` | a step is about to run its closure |
//! | `loops::step::after_effect` | the closure returned, its record is not written yet |
//! | `loops::step::after_record` | the step's record committed, not yet returned |
//! | `loops::transition::before_commit` | a handler returned; its transition is not committed |
//! | `loops::transition::after_commit` | the transition committed; the next state not started |
//! | `loops::resume::after_read` | a resume read the run's latest record |
//! | `loops::writer::after_commit` | the writer committed a batch, callers not yet answered |
//! | `loops::migrate::before_commit` | a run's migration was applied; its record is not committed |
//! | `loops::migrate::after_commit` | the migration's record committed; the run not driven on yet |
//! | `loops::create::after_link` | a new store file was linked into place, its temporary file not yet removed |

/// Aborts the process if the fault point `name` is configured to `return`.
#[inline]
pub(crate) fn point(name: &str) {
    #[cfg(feature = "failpoints")]
    (|| {
        fail::fail_point!(name, |_| std::process::abort());
    })();
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
