//! The store conformance suite (`loops::conformance`) on the redb store: on a file, in
//! memory, and on a file with every payload sealed (`conformance::Sealed`, as a runtime with a
//! codec stores them). The PostgreSQL store runs it in loops-postgres/tests/conformance.rs, which
//! docs/postgres.md shows as the example of a store running the suite (checked here).

use std::sync::Arc;

use loops::RedbStore;
use loops::Store;
use loops::conformance::Factory;

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

mod sealed {
    loops::conformance_suite!(|case| async move {
        loops::conformance::Sealed::new(super::on_file(case).await)
    });
}

mod memory {
    use std::sync::Arc;

    loops::conformance_suite!(|_case| async {
        Arc::new(loops::RedbStore::in_memory().expect("an in-memory store"))
    });
}

/// docs/postgres.md shows loops-postgres/tests/conformance.rs (but for its header comment) as
/// the example of a store running the suite: the example is that file, so it compiles.
#[test]
fn postgres_md_shows_the_postgres_suite() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let doc = read("docs/postgres.md");
    let section = doc
        .split_once("### The conformance suite")
        .expect("docs/postgres.md has a section on the conformance suite")
        .1;
    let example = section
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .expect("the section has a rust example")
        .0;
    let file = read("loops-postgres/tests/conformance.rs");
    let code: String = file
        .lines()
        .skip_while(|line| line.starts_with("//!") || line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(example, code);
}
