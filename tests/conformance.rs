//! The store conformance suite (`loops::conformance`) on the redb store: on a file, and in
//! memory. The PostgreSQL store runs it in loops-postgres/tests/conformance.rs.

use std::sync::Arc;

use loops::RedbStore;
use loops::conformance::Factory;
use loops::store::Store;

/// A redb store on a file of a temporary directory, deleted when the case ends.
struct OnFile {
    store: Arc<RedbStore>,
    _dir: tempfile::TempDir,
}

impl Factory for OnFile {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store) as Arc<dyn Store>
    }
}

async fn on_file(_case: &'static str) -> OnFile {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = RedbStore::open(dir.path().join("store.redb")).expect("a new redb file opens");
    OnFile {
        store: Arc::new(store),
        _dir: dir,
    }
}

mod file {
    loops::conformance_suite!(super::on_file);
}

mod memory {
    use std::sync::Arc;

    loops::conformance_suite!(|_case| async {
        Arc::new(loops::RedbStore::in_memory().expect("an in-memory store"))
    });
}
