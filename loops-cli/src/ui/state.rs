//! What every request of the UI shares: how the store is reached, the guard, the notes of
//! writes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::guard::Guard;
use crate::failure::{Failure, Result};
use crate::open::{self, Access, Target};
use crate::operator::{Local, Operator};

/// Notes kept for the pages that writes redirect to (the oldest are dropped).
const NOTES_KEPT: usize = 64;

/// The UI's state, shared by every request.
pub struct Ui {
    /// What the store is called on the pages.
    pub label: String,
    /// How the store is reached.
    pub stores: Stores,
    /// The checks of every request, and the forms' token.
    pub guard: Arc<Guard>,
    /// What writes said.
    pub notes: Mutex<Notes>,
}

/// What writes said, for the page each redirects to: `?note=N`.
#[derive(Default)]
pub struct Notes {
    next: u64,
    /// `(N, run id, text)`, oldest first.
    kept: VecDeque<(u64, String, String)>,
}

impl Ui {
    /// Runs `f` on the store, reached for `access`: on a blocking thread (the operators block
    /// on their own async runtimes). Fails as reaching the store or `f` fails.
    pub async fn with<T: Send + 'static>(
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

    /// Keeps `text`, what a write to the run `run_id` did, for the run's page it redirects
    /// to; returns its number.
    pub fn keep_note(&self, run_id: &str, text: String) -> u64 {
        let mut notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        let n = notes.next;
        notes.next += 1;
        notes.kept.push_back((n, run_id.to_owned(), text));
        if notes.kept.len() > NOTES_KEPT {
            notes.kept.pop_front();
        }
        n
    }

    /// The note numbered `n`, if it is still kept and is about the run `run_id` (a number
    /// in another run's address, by hand or from a bookmark, shows nothing).
    pub fn note(&self, n: u64, run_id: &str) -> Option<String> {
        let notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        notes
            .kept
            .iter()
            .find(|(k, run, _)| *k == n && run == run_id)
            .map(|(_, _, text)| text.clone())
    }
}

/// How the UI reaches the store.
pub enum Stores {
    /// A store file, reached afresh for each request (and let go after it), so that the
    /// workflow's process can open it between two requests.
    File(Target),
    /// A PostgreSQL store: one pool for the UI's life (its workers share the store).
    Postgres(Mutex<Local>),
}

impl Stores {
    /// Reaches the store once, so that a wrong path or a server that is down fails at start.
    pub fn open(target: &Target) -> Result<Stores> {
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

    /// What the store is called in messages.
    pub fn label(&self) -> String {
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
