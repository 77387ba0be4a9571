//! `loops ui`: a local web page over the same operations as the other commands.
//!
//! Every page is rendered on the server (maud escapes every value it interpolates: payloads
//! hold model output); a small script (assets/ui.js) refreshes the live parts of a page by
//! fetching their HTML again, and asks for confirmation before a write. Reads and writes go
//! through the CLI's [`Operator`]: a store file is reached for each request as `loops runs`
//! reaches it (through the control endpoint of the process that holds it, when one serves
//! it), so that a process may start, hold the file and serve between two requests; a
//! PostgreSQL store is connected to once.
//!
//! Writes are POSTs that carry the page's per-process token and come from the page's own
//! origin; every request must name the address the UI listens on as its `Host` (see
//! [`guard`]).

mod guard;
mod handlers;
mod pages;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};

use crate::cli::UiArgs;
use crate::failure::{Failure, Result};
use crate::open::{self, Access, Target};
use crate::operator::{Local, Operator};
use crate::output::{emit, note};
use guard::Guard;

/// Notes kept for the pages that writes redirect to (the oldest are dropped).
const NOTES_KEPT: usize = 64;

/// Serves the UI for the store `target` on `args.listen` until Ctrl-C (or SIGTERM). Fails if
/// the store cannot be reached at start (the same message as any command's), or the address
/// cannot be listened on.
pub fn serve(target: &Target, args: &UiArgs) -> Result<()> {
    let stores = Stores::open(target)?;
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("cannot start the async runtime: {e}")))?;
    let listener = tokio
        .block_on(tokio::net::TcpListener::bind(args.listen))
        .map_err(|e| Failure::new(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("cannot read the address listened on: {e}")))?;
    let ui = Arc::new(Ui {
        label: stores.label(),
        stores,
        guard: Guard::new(addr)?,
        notes: Mutex::new(Notes::default()),
    });
    let reach = if addr.ip().is_loopback() {
        "loopback only"
    } else {
        "reachable from other machines: anyone who reaches it can read every run and steer runs"
    };
    emit(&format!(
        "loops ui: serving the runs of store {} on http://{addr}/ ({reach}); Ctrl-C stops\n",
        ui.label
    ))?;
    let app = router(Arc::clone(&ui));
    let served = tokio.block_on(async {
        axum::serve(listener, app)
            .with_graceful_shutdown(stopped())
            .await
    });
    // The last reference is dropped here, outside the async runtime: a PostgreSQL store's
    // operator holds a runtime of its own, which must not be dropped inside another.
    drop(tokio);
    drop(ui);
    served.map_err(|e| Failure::new(format!("the UI's server stopped: {e}")))
}

/// Resolves when the process is asked to stop (Ctrl-C, or SIGTERM on Unix).
async fn stopped() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    note("loops ui: stopping");
}

fn router(ui: Arc<Ui>) -> Router {
    Router::new()
        .route("/", get(handlers::runs_page))
        .route("/live/runs", get(handlers::runs_live))
        .route("/runs/{run_id}", get(handlers::run_page))
        .route("/live/runs/{run_id}", get(handlers::run_live))
        .route("/runs/{run_id}/graph.svg", get(handlers::graph))
        .route("/runs/{run_id}/send", post(handlers::send))
        .route("/runs/{run_id}/cancel", post(handlers::cancel))
        .route("/runs/{run_id}/retry", post(handlers::retry))
        .route("/assets/ui.js", get(handlers::script))
        .route("/assets/ui.css", get(handlers::style))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&ui),
            guard::check,
        ))
        .with_state(ui)
}

/// The UI's state, shared by every request.
pub struct Ui {
    /// What the store is called on the pages.
    label: String,
    stores: Stores,
    guard: Guard,
    notes: Mutex<Notes>,
}

/// What writes said, for the page each redirects to: `?note=N`.
#[derive(Default)]
struct Notes {
    next: u64,
    kept: VecDeque<(u64, String)>,
}

impl Ui {
    /// Runs `f` on the store, reached for `access`: on a blocking thread (the operators block
    /// on their own async runtimes). Fails as reaching the store or `f` fails.
    async fn with<T: Send + 'static>(
        self: &Arc<Self>,
        access: Access,
        f: impl FnOnce(&dyn Operator) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ui = Arc::clone(self);
        tokio::task::spawn_blocking(move || ui.stores.with(access, f))
            .await
            .unwrap_or_else(|e| {
                Err(Failure::new(format!(
                    "the request stopped before it answered: {e}"
                )))
            })
    }

    /// Keeps `text` for the page a write redirects to; returns its number.
    fn keep_note(&self, text: String) -> u64 {
        let mut notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        let n = notes.next;
        notes.next += 1;
        notes.kept.push_back((n, text));
        if notes.kept.len() > NOTES_KEPT {
            notes.kept.pop_front();
        }
        n
    }

    /// The note numbered `n`, if it is still kept.
    fn note(&self, n: u64) -> Option<String> {
        let notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        notes
            .kept
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, text)| text.clone())
    }
}

/// How the UI reaches the store.
enum Stores {
    /// A store file, reached afresh for each request (and let go after it), so that the
    /// workflow's process can open it between two requests.
    File(Target),
    /// A PostgreSQL store: one pool for the UI's life (its workers share the store).
    Postgres(Mutex<Local>),
}

impl Stores {
    /// Reaches the store once, so that a wrong path or a server that is down fails at start.
    fn open(target: &Target) -> Result<Stores> {
        match target {
            Target::File(_) => {
                open::operator(target, Access::Read)?.close();
                Ok(Stores::File(target.clone()))
            }
            Target::Postgres { url, schema } => {
                Ok(Stores::Postgres(Mutex::new(open::postgres(url, schema)?)))
            }
        }
    }

    fn label(&self) -> String {
        match self {
            Stores::File(target) => target
                .file()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            Stores::Postgres(local) => local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .label()
                .to_owned(),
        }
    }

    fn with<T>(&self, access: Access, f: impl FnOnce(&dyn Operator) -> Result<T>) -> Result<T> {
        match self {
            Stores::File(target) => {
                let operator = open::operator(target, access)?;
                let out = f(&*operator);
                operator.close();
                match (out, target.file()) {
                    (Err(failure), Some(path)) => Err(failure.in_store(path, false)),
                    (out, _) => out,
                }
            }
            Stores::Postgres(local) => f(&*local.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }
}
