//! One run: the [`Context`](context::Context) a handler is given, the dispatch to a state's
//! handler, and the driver that takes the run from its last record to its end. Nothing here
//! knows the runtime: the driver is handed the store, its settings and the run it holds.

pub(crate) mod attempts;
pub(crate) mod context;
pub(crate) mod dispatch;
pub(crate) mod driver;
pub(crate) mod limits;
pub(crate) mod settings;
#[cfg(feature = "test-util")]
pub(crate) mod test_util;
