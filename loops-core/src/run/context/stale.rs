//! Steps whose recorded output goes stale ([`StepOptions::valid_for`],
//! [`StepOptions::revalidate`]): which record of a step a re-execution replays, or under
//! which name it runs the step again.
//!
//! A step's first output is recorded under its own name (generation 0). When a replay finds
//! generation `g` stale, it records why under `loops:stale:{g}:{name}` and looks for
//! generation `g + 1`, recorded under `loops:redo:{g + 1}:{name}`, both at the step's
//! occurrence; the first generation that is missing runs. Records are never changed, and a
//! generation once found stale is not checked again, so every later replay comes to the
//! same generation.

use serde::Serialize;

use crate::clock::duration_ms;
use crate::error::{Error, Result};
use crate::names::RESERVED_PREFIX;
use crate::record::StepRecord;
use crate::run::context::{Context, StepOptions};

/// Why a generation of a step went stale, as recorded.
#[derive(Serialize)]
struct StaleRecord<'a> {
    /// The generation found stale, from 0.
    generation: u32,
    /// When it was recorded, ms since the Unix epoch.
    recorded_at_ms: u64,
    /// Why it is stale.
    why: &'a str,
}

/// What a step does with its journal.
pub(super) enum Resolved {
    /// Replay this record, recorded under this name.
    Replay(StepRecord, String),
    /// Run the step, and record its output under this name (the step's own name for
    /// generation 0).
    Run(String),
}

impl Context {
    /// The record of the step `(name, occurrence)` that is still fresh, or the name to run
    /// it under; `recorded` is generation 0's record, if any.
    ///
    /// # Errors
    /// [`Error::StepDecode`] if a record does not decode for `options`'s revalidation
    /// check; [`Error::Storage`] if a stale record could not be recorded as such.
    pub(super) async fn resolve(
        &self,
        name: &str,
        occurrence: u32,
        recorded: Option<StepRecord>,
        options: &StepOptions,
    ) -> Result<Resolved> {
        let mut generation = 0u32;
        let mut record_name = name.to_owned();
        let mut recorded = recorded;
        loop {
            let Some(record) = recorded else {
                return Ok(Resolved::Run(record_name));
            };
            let stale_name = format!("{RESERVED_PREFIX}stale:{generation}:{name}");
            let stale = if self.take_record(&stale_name, occurrence).is_some() {
                true
            } else if let Some(why) = self
                .staleness(&record_name, occurrence, &record, options)
                .await?
            {
                tracing::info!(
                    step = name,
                    occurrence,
                    generation,
                    why = %why,
                    "recorded step output is stale: running the step again"
                );
                let marker = StaleRecord {
                    generation,
                    recorded_at_ms: record.at_ms,
                    why: &why,
                };
                self.record_step(&stale_name, occurrence, &marker, 0)
                    .await?;
                true
            } else {
                false
            };
            if !stale {
                return Ok(Resolved::Replay(record, record_name));
            }
            generation = generation.saturating_add(1);
            record_name = format!("{RESERVED_PREFIX}redo:{generation}:{name}");
            recorded = self.take_record(&record_name, occurrence);
        }
    }

    /// Why `record` (of the step recorded as `(record_name, occurrence)`) is stale under
    /// `options`, or `None` while it holds.
    async fn staleness(
        &self,
        record_name: &str,
        occurrence: u32,
        record: &StepRecord,
        options: &StepOptions,
    ) -> Result<Option<String>> {
        if let Some(valid_for) = options.valid_for {
            let age_ms = self.run.time.now_ms().saturating_sub(record.at_ms);
            let valid_ms = duration_ms(valid_for);
            if age_ms > valid_ms {
                return Ok(Some(format!(
                    "recorded {age_ms} ms ago, valid for {valid_ms} ms"
                )));
            }
        }
        if let Some(check) = &options.revalidate {
            let holds = check(&record.output)
                .await
                .map_err(|source| Error::StepDecode {
                    run_id: self.run.run_id.clone(),
                    state: self.state,
                    seq: self.seq,
                    step: record_name.to_owned(),
                    occurrence,
                    source,
                })?;
            if !holds {
                return Ok(Some(
                    "its revalidation check says it no longer holds".to_owned(),
                ));
            }
        }
        Ok(None)
    }
}
