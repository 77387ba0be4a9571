//! Fault points of the PostgreSQL store (cargo feature `failpoints`, off by default; without
//! it they compile to nothing).
//!
//! With the feature on, a test process sets an action on a point with the `fail` crate
//! (`fail::cfg_callback(name, f)` runs `f` there, on the writing thread: a callback that
//! blocks holds the write at that point).
//!
//! | name | where |
//! |---|---|
//! | `loops_postgres::write::before_commit` | a write's first round trip (`BEGIN`, the row locks, its reads) is done; its second (the changes and `COMMIT`) is not sent yet. On the one-round-trip path: its one statement is not sent yet |
//! | `loops_postgres::listen::connect` | the wake-up listener is about to connect; `return` makes the attempt fail (the listener stays down and tries again after its back-off) |

/// The fault point `loops_postgres::write::before_commit`.
#[inline]
pub(crate) fn before_commit() {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("loops_postgres::write::before_commit");
}

/// The fault point `loops_postgres::listen::connect`: whether the listener's connection
/// attempt is to fail (its action is `return`).
#[inline]
pub(crate) fn listener_refused() -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("loops_postgres::listen::connect", |_| true);
    false
}
