//! The connection a read or a write holds, and what becomes of it when it is dropped.

use deadpool_postgres::Object;

/// Returns a connection to the pool only when the write left it clean; drops it otherwise (a
/// write cancelled midway, a failed connection), which rolls back what it had not committed.
pub(crate) struct Guard(pub(crate) Option<Object>);

impl Guard {
    pub(crate) fn client(&self) -> &Object {
        // Set until `keep` consumes the guard.
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("the guard holds its connection"))
    }

    pub(crate) fn keep(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}
