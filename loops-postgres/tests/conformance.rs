//! The store conformance suite (`loops::conformance`) on the PostgreSQL store: each case on a
//! PostgreSQL schema of its own, under leases of 1 s; its second handle is a second store
//! (a pool of its own) on the same schema, as another worker opens it; and again with every
//! payload sealed (`conformance::Sealed`), on schemas of their own. The redb store runs
//! the suite in the root package's tests/conformance.rs.

mod common;

use std::sync::Arc;
use std::time::Duration;

use loops::conformance::Factory;
use loops::{BoxFuture, Store};

/// The lease time of the stores of this suite.
const TTL: Duration = Duration::from_secs(1);

struct PgFactory {
    schema: common::TestSchema,
    store: Arc<dyn Store>,
}

impl Factory for PgFactory {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>> {
        Box::pin(async { Some(Arc::new(self.schema.store(TTL).await) as Arc<dyn Store>) })
    }
}

/// A store on a fresh schema `name` (dropped with everything in it when the case ends).
async fn fresh(name: String) -> PgFactory {
    let schema = common::TestSchema::new(&name).await;
    let store = Arc::new(schema.store(TTL).await);
    PgFactory { schema, store }
}

loops::conformance_suite!(|case| fresh(format!("c_{case}")));

/// The same cases with payloads sealed, as a runtime with a codec stores them.
mod sealed {
    use loops::conformance::Sealed;

    loops::conformance_suite!(|case| async move {
        Sealed::new(super::fresh(format!("s_{case}")).await)
    });
}
