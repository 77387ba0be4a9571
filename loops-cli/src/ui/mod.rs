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
mod query;
mod state;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};

use crate::cli::UiArgs;
use crate::failure::{Failure, Result};
use crate::open::Target;
use crate::output::{emit, note};
use guard::Guard;
use state::{Notes, Stores, Ui};

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
        guard: Arc::new(Guard::new(addr)?),
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
        .layer(axum::extract::DefaultBodyLimit::max(FORM_LIMIT_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&ui),
            handlers::refuse_oversized,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&ui.guard),
            guard::check,
        ))
        .with_state(ui)
}

/// The most bytes a form posted to the UI may hold: an event's payload up to loops' limit
/// ([`DEFAULT_MAX_PAYLOAD_BYTES`](loops_core::DEFAULT_MAX_PAYLOAD_BYTES)) arrives
/// percent-encoded, up to three bytes for each of its bytes, beside the form's other fields.
/// (axum's default, 2 MB, refused payloads well under loops' limit.) A payload over loops'
/// limit that fits is refused by the send, as `loops send` refuses it.
pub(crate) const FORM_LIMIT_BYTES: usize = 3 * loops_core::DEFAULT_MAX_PAYLOAD_BYTES + 64 * 1024;
