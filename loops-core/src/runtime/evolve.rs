//! Workflow evolution at run time: routing a stored run to the registered version that takes
//! it ([`route`]), committing its migration, blocking the runs no version takes (once, quietly),
//! unblocking them when a build that can route them starts, and the dry run that says what a
//! build would do with every unfinished run ([`Runtime::dry_run`]).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result, error_chain};
use crate::migrate::{Chain, Migrated, Migration};
use crate::panics::panic_message;
use crate::record::{MigratedFrom, TransitionRecord};
use crate::route::{Blocked, KnownVersion, Route, StoredRun, route};
use crate::row::RunInfo;
use crate::run::driver::Entered;
use crate::run::settings::logged_text;
use crate::runtime::claims::Claim;
use crate::runtime::handle::{Prepared, Registry, Runtime};
use crate::schema::{SchemaDiff, SchemaHash};
use crate::status::RunStatus;
use crate::store::Write;
use crate::workflow::Workflow;

/// What routing a found run came to.
pub(crate) enum Routing {
    /// Drive it: unblocked or migrated already, if it had to be.
    Ready(Box<Prepared>),
    /// No version takes it; blocked (when the caller asked for that), with why.
    Blocked(Blocked),
}

/// What [`Runtime::prepare`] does with a run that no version takes, and who says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBlock {
    /// Leave it as it is: the caller decides (a failing migration blocks it all the same).
    Leave,
    /// Mark it blocked; the caller returns the refusal (with the changes) to its own caller,
    /// who says it: the log line is at INFO, so that the changes are not printed twice.
    Return,
    /// Mark it blocked and log one WARN line with the reason and the changes: a background
    /// driver's block, which nobody else reports.
    Warn,
}

impl OnBlock {
    /// Whether a block is logged at WARN (else at INFO).
    fn warns(self) -> bool {
        self == OnBlock::Warn
    }
}

/// What a build would do with one stored run: an item of [`Runtime::dry_run`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Routed {
    /// The run.
    pub run_id: String,
    /// Its workflow's name.
    pub workflow: String,
    /// The state it is in.
    pub state: String,
    /// Where it stands (running, waiting or blocked).
    pub status: RunStatus,
    /// The schema hash stored with it.
    pub schema: SchemaHash,
    /// What this build would do with it.
    pub route: Route,
}

impl Runtime {
    /// Routes the found run `(info, record)` that `claim` holds among the versions `known`
    /// and the registered migrations, and prepares it for the version that takes it: a
    /// blocked run is unblocked, a run of an older version with a migration path is migrated
    /// (the migration committed as a record of its own). A run no version takes is blocked
    /// (once) unless `on_block` is [`OnBlock::Leave`]; a failing migration always blocks the
    /// run. `on_block` says whether the block is logged at WARN.
    ///
    /// # Errors
    /// The store's errors; [`Error::PayloadTooLarge`] for a migrated state over the limit.
    pub(crate) async fn prepare(
        &self,
        claim: &Claim,
        (info, record): (RunInfo, TransitionRecord),
        known: &[KnownVersion],
        on_block: OnBlock,
    ) -> Result<Routing> {
        let (route, description) = self.described_route(&info, known).await?;
        // `rerouted`: whether a record of this routing moved the run to the version.
        let (version, accepted, rerouted, info, record) = match route {
            Route::Drive(version) => (version.hash, None, false, info, record),
            // An ended run is not accepted in the store either (nothing more is written).
            Route::Accept { version, .. } if info.status.is_ended() => {
                (version.hash, Some(info.schema), false, info, record)
            }
            Route::Accept { version, .. } => {
                let from_version = description
                    .as_deref()
                    .and_then(crate::schema::described_version);
                let (info, record) = self
                    .accept_run(claim, (&info, &record), (from_version, version.hash), known)
                    .await?;
                (version.hash, None, true, info, record)
            }
            // An ended run is not migrated in the store (nothing more is written for it):
            // its terminal state is read through the chain, for its caller.
            Route::Migrate(chain) if info.status.is_ended() => {
                let (info, record) = read_through(&info, &record, &chain)?;
                (chain.to().hash, None, false, info, record)
            }
            Route::Migrate(chain) => match self
                .migrate_run(claim, (&info, &record), &chain, known, on_block.warns())
                .await?
            {
                Ok((info, record)) => (chain.to().hash, None, true, info, record),
                Err(blocked) => return Ok(Routing::Blocked(blocked)),
            },
            Route::Block(blocked) => {
                if on_block != OnBlock::Leave {
                    self.block_run(claim, &info, &blocked, on_block.warns())
                        .await?;
                }
                return Ok(Routing::Blocked(blocked));
            }
        };
        let info = if info.status == RunStatus::Blocked {
            let unblocked = self
                .store()
                .write(
                    Some(&claim.held().lease),
                    Write::Unblock {
                        run_id: info.run_id.clone(),
                        at_ms: self.now_ms(),
                    },
                )
                .await?
                .into_run(&info.run_id)?;
            tracing::info!(status = %unblocked.status, "run unblocked");
            unblocked
        } else {
            info
        };
        Ok(Routing::Ready(Box::new(Prepared {
            entered: Entered {
                info,
                record,
                fresh: false,
                rerouted,
            },
            version,
            accepted,
        })))
    }

    /// [`route`] for the stored run `info`, among `known` and the registered migrations.
    pub(crate) async fn route_of(&self, info: &RunInfo, known: &[KnownVersion]) -> Result<Route> {
        Ok(self.described_route(info, known).await?.0)
    }

    /// [`route_of`](Self::route_of), with the stored description of the run's schema it read
    /// (`None` if a compiled version has the schema, or the store has none).
    async fn described_route(
        &self,
        info: &RunInfo,
        known: &[KnownVersion],
    ) -> Result<(Route, Option<String>)> {
        let description = if known.iter().any(|k| k.stored.hash == info.schema) {
            None
        } else {
            self.store().schema(info.schema).await?
        };
        let migrations = self.registry(|r| r.migrations().to_vec());
        let run = StoredRun {
            workflow: &info.workflow,
            schema: info.schema,
            state: &info.state,
            description: description.as_deref(),
        };
        let route = route(&run, known, &migrations);
        Ok((route, description))
    }

    /// Migrates the run `(info, record)` through `chain` and commits the migration's record;
    /// `Ok(Err(_))` (and the run blocked, nothing else written; logged at WARN if `warn`) if
    /// the migration fails or panics.
    async fn migrate_run(
        &self,
        claim: &Claim,
        (info, record): (&RunInfo, &TransitionRecord),
        chain: &Chain,
        known: &[KnownVersion],
        warn: bool,
    ) -> Result<std::result::Result<(RunInfo, TransitionRecord), Blocked>> {
        let run_id = &info.run_id;
        let migrated = match apply_chain(chain, record.payload.get()) {
            Ok(migrated) => migrated,
            Err(blocked) => {
                self.block_run(claim, info, &blocked, warn).await?;
                return Ok(Err(blocked));
            }
        };
        let to = chain.to();
        let seq = next_seq(info)?;
        let payload =
            serde_json::value::RawValue::from_string(migrated.payload).map_err(|source| {
                Error::Encode {
                    run_id: run_id.clone(),
                    state: migrated.state.to_owned(),
                    seq,
                    source,
                }
            })?;
        let new = TransitionRecord {
            seq,
            state: migrated.state.to_owned(),
            at_ms: self.now_ms(),
            schema: to.hash,
            payload,
            migrated: Some(MigratedFrom {
                schema: info.schema,
                version: chain.from().version,
                seq: info.state_seq(),
                accepted: false,
            }),
        };
        let info = self
            .commit_evolved(claim, info, (&new, migrated.terminal), known)
            .await?;
        tracing::info!(
            from = %chain.from().hash,
            from_version = chain.from().version,
            to = %to.hash,
            to_version = to.version,
            seq,
            state = %new.state,
            "run migrated"
        );
        Ok(Ok((info, new)))
    }

    /// Commits the acceptance of the run `(info, record)` (of the version `from_version`, as
    /// its stored description names it) by the registered version with the schema hash `to`,
    /// which lists the run's schema in its `accepts`: a record of its own
    /// at `seq + 1`, the same state and data under `to` ([`MigratedFrom::accepted`]),
    /// written as a migration's record is ([`Write::Migrate`]). From it on the run is that
    /// version's, in the store too: its row's schema is `to`, so that a sender (`loops send`
    /// with no build at hand included) checks events against the events the version driving
    /// the run declares, the CLI and the UI describe the run by it, and a worker of the old
    /// version no longer claims a run whose state the new version has begun.
    ///
    /// # Errors
    /// The store's errors; [`Error::PayloadTooLarge`] as for any record;
    /// [`Error::MigrationRefused`] if the run's seq is at its limit.
    async fn accept_run(
        &self,
        claim: &Claim,
        (info, record): (&RunInfo, &TransitionRecord),
        (from_version, to): (Option<u32>, SchemaHash),
        known: &[KnownVersion],
    ) -> Result<(RunInfo, TransitionRecord)> {
        let from_version = from_version.unwrap_or(0);
        let new = TransitionRecord {
            seq: next_seq(info)?,
            state: record.state.clone(),
            at_ms: self.now_ms(),
            schema: to,
            payload: record.payload.clone(),
            migrated: Some(MigratedFrom {
                schema: info.schema,
                version: from_version,
                seq: info.state_seq(),
                accepted: true,
            }),
        };
        // The run's own state, which has not ended it: not terminal.
        let accepted = self
            .commit_evolved(claim, info, (&new, false), known)
            .await?;
        tracing::info!(
            from = %info.schema,
            from_version,
            to = %to,
            seq = new.seq,
            state = %new.state,
            "run accepted as it is"
        );
        Ok((accepted, new))
    }

    /// Commits `new`, a migration's or an acceptance's record for the run `info` (held by
    /// `claim`), with the description of its schema (a version among `known`), and whether
    /// its state is terminal (the run then completes); returns the run's new row.
    ///
    /// # Errors
    /// [`Error::NotRegistered`] if no version in `known` has `new`'s schema; the store's
    /// errors; [`Error::PayloadTooLarge`] for a record over the limit.
    async fn commit_evolved(
        &self,
        claim: &Claim,
        info: &RunInfo,
        (new, terminal): (&TransitionRecord, bool),
        known: &[KnownVersion],
    ) -> Result<RunInfo> {
        let Some(to) = known.iter().find(|k| k.stored.hash == new.schema) else {
            return Err(Error::NotRegistered {
                workflow: info.workflow.clone(),
            });
        };
        self.inner.config.settings.check_size(&info.run_id, new)?;
        crate::failpoint::point("loops::migrate::before_commit");
        let info = self
            .store()
            .write(
                Some(&claim.held().lease),
                Write::Migrate {
                    run_id: info.run_id.clone(),
                    seq: info.seq,
                    record: new.clone(),
                    schema_text: to.schema,
                    terminal,
                },
            )
            .await?
            .into_run(&info.run_id)?;
        crate::failpoint::point("loops::migrate::after_commit");
        Ok(info)
    }

    /// The terminal state of the ended run `info` (its terminal `record`), typed as `W`:
    /// decoded, or, when it ended under another version from which the registered
    /// migrations lead to `W`, read through them in memory ([`read_through`]: an ended run
    /// is not migrated in the store).
    ///
    /// # Errors
    /// [`Error::MigrationRefused`] if a migration of the chain fails; [`Error::Decode`] (or
    /// [`Error::Payload`]) if the state does not decode as `W`.
    pub(crate) fn terminal_as<W: Workflow>(
        &self,
        info: &RunInfo,
        record: TransitionRecord,
    ) -> Result<W> {
        let compiled = W::SCHEMA_HASH.pinned();
        let chain = (record.schema != compiled)
            .then(|| {
                self.registry(|r| {
                    Migration::path(r.migrations(), W::NAME, record.schema, |h| h == compiled)
                })
            })
            .flatten();
        match chain {
            Some(chain) => read_through(info, &record, &chain)?.1.decode(&info.run_id),
            None => record.decode(&info.run_id),
        }
    }

    /// Marks the run blocked for `blocked`'s reason, once: nothing is written (nor logged)
    /// if it is blocked for that already. The block is logged once: at WARN with the reason
    /// and the changes if `warn` (nobody else reports it), else at INFO without the changes
    /// (the caller returns them in its error).
    pub(crate) async fn block_run(
        &self,
        claim: &Claim,
        info: &RunInfo,
        blocked: &Blocked,
        warn: bool,
    ) -> Result<RunInfo> {
        let already = info.status == RunStatus::Blocked
            && info
                .block
                .as_ref()
                .is_some_and(|b| b.schema == info.schema && b.reason == blocked.reason);
        // An ended run is never blocked: nothing more is written for it (the store would
        // refuse the write), and no build drives it again; the caller says why it cannot
        // read it.
        if already || info.status.is_ended() {
            return Ok(info.clone());
        }
        let changes: Vec<String> = blocked.changes.iter().map(ToString::to_string).collect();
        let after = self
            .store()
            .write(
                Some(&claim.held().lease),
                Write::Block {
                    run_id: info.run_id.clone(),
                    schema: info.schema,
                    reason: blocked.reason.clone(),
                    changes,
                    at_ms: self.now_ms(),
                },
            )
            .await?
            .into_run(&info.run_id)?;
        // The reason is sealed in the store under a codec (a migration's refusal may quote
        // the state): a log line leaves it out then, as it does error texts. The changes are
        // schema facts, in clear in the store too.
        let reason = logged_text(self.inner.config.settings.log_texts, || {
            blocked.reason.clone()
        });
        if warn {
            tracing::warn!(
                run_id = %info.run_id,
                workflow = %info.workflow,
                schema = %info.schema,
                state = %info.state,
                reason = %reason,
                changes = %blocked.changes,
                "run blocked: this build cannot drive it; it is left as it is until a build that can starts (see docs/evolution.md)"
            );
        } else {
            tracing::info!(
                run_id = %info.run_id,
                workflow = %info.workflow,
                schema = %info.schema,
                state = %info.state,
                reason = %reason,
                "run blocked: this build cannot drive it (the refusal returned says what changed)"
            );
        }
        Ok(after)
    }

    /// Looks at the blocked runs of the registered workflows, if a registration (or the
    /// runtime's start) asked for it: each run that this build can route now gets a
    /// background driver, which unblocks (or migrates) it and drives it. Returns those runs.
    ///
    /// # Errors
    /// The store's errors (the sweep is asked for again).
    pub(crate) async fn sweep_blocked(&self) -> Result<Vec<RunInfo>> {
        if !self.inner.sweep.swap(false, Ordering::AcqRel) {
            return Ok(Vec::new());
        }
        let swept = self.sweep_once().await;
        if swept.is_err() {
            self.inner.sweep.store(true, Ordering::Release);
        }
        swept
    }

    async fn sweep_once(&self) -> Result<Vec<RunInfo>> {
        let mut routable = Vec::new();
        for workflow in self.workflows() {
            let known = self.registry(|r| r.known(&workflow));
            for info in self
                .store()
                .list(RunStatus::Blocked, Some(&workflow))
                .await?
            {
                if self.drive_blocked_if_routable(&info, &known).await? {
                    routable.push(info);
                }
            }
        }
        if !routable.is_empty() {
            tracing::info!(
                runs = routable.len(),
                "unblocking runs this build can route"
            );
        }
        Ok(routable)
    }

    /// Gives the blocked run `info` a driver if this build can route it now (among `known`,
    /// the registered versions of its workflow, and the registered migrations); returns
    /// whether it did.
    async fn drive_blocked_if_routable(
        &self,
        info: &RunInfo,
        known: &[KnownVersion],
    ) -> Result<bool> {
        if info.status != RunStatus::Blocked
            || matches!(self.route_of(info, known).await?, Route::Block(_))
        {
            return Ok(false);
        }
        self.spawn_driver(&info.workflow, &info.run_id);
        Ok(true)
    }

    /// After a driver that could not route `run_id` let it go: if a version or migration was
    /// registered since the registry's generation was `registrations` (when the driver
    /// began), that registration's sweep found the run driven and left it, so the run, if
    /// blocked, is routed again and driven if it can be now. Errors reading the store are
    /// logged (the next registration or `resume_all` looks again).
    pub(crate) async fn route_again_if_registered(&self, run_id: &str, registrations: u64) {
        if self.registry(Registry::generation) == registrations {
            return;
        }
        let routed = async {
            let Some(info) = self.store().run_info(run_id).await? else {
                return Ok(false);
            };
            let known = self.registry(|r| r.known(&info.workflow));
            self.drive_blocked_if_routable(&info, &known).await
        };
        if let Err(e) = routed.await {
            tracing::warn!(run_id, error = %e, "could not look at the blocked run again");
        }
    }

    /// What this build would do with every unfinished or blocked run in the store, by
    /// workflow then run id, writing nothing: drive it on the version with its schema,
    /// migrate it to a later version, drive it on a version that accepts its schema, or
    /// leave it blocked (runs of workflows this runtime registers no version of included,
    /// with a reason saying so). A migration is tried on the run's state in memory: a run
    /// it refuses (or that makes it panic) is said blocked with the reason its migration
    /// would record.
    ///
    /// # Errors
    /// The store's errors, reading the status index or the schema descriptions.
    pub async fn dry_run(&self) -> Result<Vec<Routed>> {
        let mut out = Vec::new();
        let mut known: HashMap<String, Vec<KnownVersion>> = HashMap::new();
        for status in [RunStatus::Running, RunStatus::Waiting, RunStatus::Blocked] {
            for info in self.store().list(status, None).await? {
                let versions = known
                    .entry(info.workflow.clone())
                    .or_insert_with(|| self.registry(|r| r.known(&info.workflow)));
                let route = if versions.is_empty() {
                    Route::Block(Blocked {
                        reason: format!(
                            "this build registers no version of workflow `{}`",
                            info.workflow
                        ),
                        changes: SchemaDiff::default(),
                    })
                } else {
                    self.route_of(&info, versions).await?
                };
                // A migration is tried on the run's state, in memory: one that refuses it
                // (or panics) would leave the run blocked, and says so here.
                let route = match route {
                    Route::Migrate(chain) => match self.store().latest(&info.run_id).await? {
                        Some((_, record)) => match apply_chain(&chain, record.payload.get()) {
                            Ok(_) => Route::Migrate(chain),
                            Err(blocked) => Route::Block(blocked),
                        },
                        None => Route::Migrate(chain),
                    },
                    other => other,
                };
                out.push(Routed {
                    run_id: info.run_id,
                    workflow: info.workflow,
                    state: info.state,
                    status: info.status,
                    schema: info.schema,
                    route,
                });
            }
        }
        out.sort_by(|a, b| (&a.workflow, &a.run_id).cmp(&(&b.workflow, &b.run_id)));
        Ok(out)
    }
}

/// `chain` applied to a run's stored state `payload`, in memory: the migrated state, or the
/// block a refusal or panic of a migration leaves the run in (its reason the refusal's
/// chain of causes, or the panic's message). The one meaning of a migration's outcome, for a
/// run migrated ([`Runtime::migrate_run`]) and for a dry run.
fn apply_chain(chain: &Chain, payload: &str) -> std::result::Result<Migrated, Blocked> {
    // `Migration::apply` catches the migration's own panics; a hand-written serde impl may
    // panic too.
    let reason = match std::panic::catch_unwind(AssertUnwindSafe(|| chain.apply(payload))) {
        Ok(Ok(migrated)) => return Ok(migrated),
        Ok(Err(e)) => error_chain(&e).join(": "),
        Err(panic) => format!("the migration panicked: {}", panic_message(&*panic)),
    };
    Err(Blocked {
        reason,
        changes: SchemaDiff::default(),
    })
}

/// The terminal record of the ended run `info` read through the migration `chain`, in
/// memory: an ended run is not migrated in the store, where nothing more is written for it,
/// but its caller (a `run`, `start` or `wait` of the id by a later version) gets its terminal
/// state typed as that version. The view keeps the record's seq and time; its schema, and
/// the row's, are the version's, and `migrated` says from what.
///
/// # Errors
/// [`Error::MigrationRefused`] if a migration of the chain fails or panics (the run is not
/// blocked: it has ended); [`Error::Encode`] if the migrated state is not JSON.
fn read_through(
    info: &RunInfo,
    record: &TransitionRecord,
    chain: &Chain,
) -> Result<(RunInfo, TransitionRecord)> {
    let refused = |reason: String| Error::MigrationRefused {
        run_id: info.run_id.clone(),
        seq: info.seq,
        reason,
    };
    let migrated = std::panic::catch_unwind(AssertUnwindSafe(|| chain.apply(record.payload.get())))
        .map_err(|panic| {
            refused(format!(
                "the migration panicked: {}",
                panic_message(&*panic)
            ))
        })?
        .map_err(|e| refused(error_chain(&e).join(": ")))?;
    let to = chain.to().hash;
    let payload = serde_json::value::RawValue::from_string(migrated.payload).map_err(|source| {
        Error::Encode {
            run_id: info.run_id.clone(),
            state: migrated.state.to_owned(),
            seq: record.seq,
            source,
        }
    })?;
    let view = TransitionRecord {
        seq: record.seq,
        state: migrated.state.to_owned(),
        at_ms: record.at_ms,
        schema: to,
        payload,
        migrated: Some(MigratedFrom {
            schema: info.schema,
            version: chain.from().version,
            seq: info.state_seq(),
            accepted: false,
        }),
    };
    let mut info = info.clone();
    info.schema = to;
    info.state = view.state.clone();
    Ok((info, view))
}

/// The seq a migration's or an acceptance's record of the run `info` takes: the run's next.
///
/// # Errors
/// [`Error::MigrationRefused`] if the run's seq is at its limit.
fn next_seq(info: &RunInfo) -> Result<u64> {
    info.seq
        .checked_add(1)
        .ok_or_else(|| Error::MigrationRefused {
            run_id: info.run_id.clone(),
            seq: info.seq,
            reason: "the run's seq is at its limit".to_owned(),
        })
}
