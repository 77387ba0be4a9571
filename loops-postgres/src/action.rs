//! What a write is doing, in the words of its errors (`committing seq 3 of run `r``).

use loops_core::Write;

/// What a write is doing, for errors.
pub(crate) fn describe(write: &Write) -> String {
    match write {
        Write::Create { info, .. } => format!("creating run `{}`", info.run_id),
        Write::Transition { run_id, seq, .. } => {
            format!("committing seq {seq} of run `{run_id}`")
        }
        Write::Step {
            run_id, seq, name, ..
        } => format!("recording step `{name}` of run `{run_id}` seq {seq}"),
        Write::Failure { run_id, seq, .. } => {
            format!("recording a failure of run `{run_id}` seq {seq}")
        }
        Write::BeginAttempt { run_id, seq, .. } => {
            format!("starting an attempt of run `{run_id}` seq {seq}")
        }
        Write::Cancel { run_id, .. } => format!("cancelling run `{run_id}`"),
        Write::EndCancelled { run_id, .. } => format!("ending cancelled run `{run_id}`"),
        Write::Retry { run_id, .. } => format!("retrying run `{run_id}`"),
        Write::Wait { run_id, seq, .. } => format!("recording a wait of run `{run_id}` seq {seq}"),
        Write::Send { run_id, name, .. } => format!("sending event `{name}` to run `{run_id}`"),
        Write::Wake { run_id, .. } => format!("waking run `{run_id}`"),
        Write::Prune { run_ids } => format!("pruning {} runs", run_ids.len()),
        Write::SetAttributes { run_id, seq, .. } => {
            format!("setting attributes of run `{run_id}` seq {seq}")
        }
        Write::Seal { key, .. } => format!("recording sealing key `{key}`"),
        Write::PutSchedule { info } => format!("registering schedule `{}`", info.name),
        Write::PauseSchedule { name, paused, .. } => {
            let verb = if *paused { "pausing" } else { "resuming" };
            format!("{verb} schedule `{name}`")
        }
        Write::RemoveSchedule { name } => format!("removing schedule `{name}`"),
        Write::TickSchedule { name, tick_ms, .. } => {
            format!("recording that tick {tick_ms} of schedule `{name}` fired")
        }
        _ => "writing".to_owned(),
    }
}
