//! What a run's children add to the meaning of a write, once for every store: a child's end
//! wakes its parent, and a cancelled run's children are cancelled with it. Both are
//! [follow-up writes](super::Effects::follow_ups) that the store applies in the same commit.

use super::RunStatus;
use super::effects::Effects;
use super::facts::Facts;
use super::protocol::Write;
use crate::names::CHILD_ENDED;
use crate::row::OnParentCancel;

/// Adds to `effects` (the plan of `write`, given `facts`) the writes that follow from it for
/// other runs:
/// - a row that moves from not ended to ended, of a run with a parent: a
///   [`Write::Send`] of [`CHILD_ENDED`] (payload `{"child": ID}`) to the parent, so that a
///   parent waiting to join wakes (and, on a shared store, is claimable) through the same
///   path as any event;
/// - a [`Write::Cancel`]: a cancellation of each child in [`Facts::children`] whose policy
///   is [`OnParentCancel::Cancel`], with the reason `parent run `P` was cancelled` (not the
///   parent's reason, which a payload codec may have sealed for the parent alone). A
///   waiting child ends at once (`end_now`: its wait is over, nobody need drive it); a
///   running one is asked to, and ends at its driver's next boundary. Each child's own
///   cancellation cascades to its children in turn.
pub(super) fn add_follow_ups(write: &Write, facts: &Facts<'_>, effects: &mut Effects<'_>) {
    if let Some(row) = effects.row() {
        let was_live = row.was.is_some_and(|was| !was.is_ended());
        if was_live
            && row.info.status.is_ended()
            && let Some(parent) = &row.info.parent
        {
            let payload = serde_json::json!({ "child": row.info.run_id }).to_string();
            effects.follow_ups.push(Write::Send {
                run_id: parent.run_id.clone(),
                name: CHILD_ENDED.to_owned(),
                payload,
                key: None,
                at_ms: row.info.updated_ms,
            });
        }
    }
    if let Write::Cancel { run_id, at_ms, .. } = write {
        for child in &facts.children {
            let cascades = child
                .parent
                .as_ref()
                .is_some_and(|p| p.on_cancel == OnParentCancel::Cancel && p.run_id == *run_id);
            if !cascades || child.status.is_ended() {
                continue;
            }
            effects.follow_ups.push(Write::Cancel {
                run_id: child.run_id.clone(),
                reason: format!("parent run `{run_id}` was cancelled"),
                end_now: child.status == RunStatus::Waiting,
                at_ms: *at_ms,
            });
        }
    }
}
