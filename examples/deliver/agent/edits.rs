//! One child run per edit (version 2's `Planned`): the parent starts a run of
//! [`EditRun`] for each edit of its plan, waits for all of them (`join_all`), and commits
//! the edits they return, in the plan's order, in one commit, as before the split.
//!
//! The children touch no ref and no working tree: each reads its file at the run's base and
//! checks that its edit applies there (the step `apply`). The commit stays one step of the
//! parent's (`commit`, with its idempotency key), so children that run at once never race on
//! the work branch, and the branch gets one commit whatever order they end in.

use anyhow::{Context as _, Result, bail};
use loops::{Context, Workflow as _};

use super::Agent;
use crate::git::{Git, apply_edit, check_edit_path};
use crate::model::Model;
use crate::workflow::edit::{EditRun, EditRunHandler, RequestedNext};
use crate::workflow::{Base, Change, Edit};

/// The run id of the child that applies edit `index` (from 0, in the plan's order) of the
/// run `run_id`: `<run_id>/edit-<index>`. A run id too long for that (run ids are at most
/// [`loops::MAX_RUN_ID_BYTES`] bytes) is cut at a character boundary and followed by `.` and
/// 8 hex digits of the XXH3 hash of the whole id: `<cut>.<hash>/edit-<index>`.
pub fn edit_run_id(run_id: &str, index: usize) -> String {
    let suffix = format!("/edit-{index}");
    let plain = format!("{run_id}{suffix}");
    if plain.len() <= loops::MAX_RUN_ID_BYTES {
        return plain;
    }
    let hash = xxhash_rust::xxh3::xxh3_64(run_id.as_bytes()) as u32;
    // `.` and 8 hex digits.
    let room = loops::MAX_RUN_ID_BYTES.saturating_sub(suffix.len() + 9);
    let mut cut = room.min(run_id.len());
    while !run_id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}.{hash:08x}{suffix}", &run_id[..cut])
}

/// If `run_id` has the form of an edit child's id (ends in `/edit-<index>`, as every id
/// [`edit_run_id`] makes does), the part before that: the run that would start it.
/// `--run-id` refuses such ids, so that a run started by hand never takes the id a later
/// run's child needs.
pub fn edit_parent(run_id: &str) -> Option<&str> {
    run_id
        .rsplit_once("/edit-")
        .filter(|(_, index)| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
        .map(|(parent, _)| parent)
}

impl<M: Model> Agent<M> {
    /// Starts one child run of [`EditRun`] per edit of `plan` (ids from [`edit_run_id`]),
    /// on `base`, waits durably until all have ended, and returns `plan` with the edits as
    /// the children applied them, in the plan's order. On a re-execution the recorded starts
    /// and join replay: no child is started twice.
    ///
    /// # Errors
    /// A child that failed or was cancelled (`loops::ChildError`, naming it, its state and
    /// seq); loops' own errors (the store, a child id that is taken by another run).
    pub async fn apply_edits(&self, ctx: &Context, base: &Base, plan: &Change) -> Result<Change> {
        let mut children = Vec::with_capacity(plan.edits.len());
        for (index, edit) in plan.edits.iter().enumerate() {
            let initial = EditRun::Requested {
                base: base.commit.clone(),
                edit: edit.clone(),
            };
            let id = edit_run_id(ctx.run_id(), index);
            children.push(ctx.start_child(&id, initial).await?);
        }
        let joined = ctx.join_all(&children).await?;
        let mut edits = Vec::with_capacity(joined.len());
        for (child, result) in children.iter().zip(joined) {
            match result.with_context(|| format!("run {}: an edit failed", ctx.run_id()))? {
                EditRun::Applied { edit, .. } => edits.push(edit),
                other => bail!(
                    "child run {} ended in {}, which is not a terminal state",
                    child.run_id(),
                    other.state()
                ),
            }
        }
        Ok(Change {
            summary: plan.summary.clone(),
            edits,
        })
    }
}

/// The handler of [`EditRun`], registered on the runtime (`main.rs`) so that it drives the
/// children the parent starts, in the background, and resumes them after a crash.
pub struct EditApplier {
    /// The repository the edits apply to (read only: its objects, never its checkout).
    pub git: Git,
}

impl EditRunHandler for EditApplier {
    type Error = anyhow::Error;

    /// `Requested`: the step `apply` reads the edit's file at `base` and checks that the
    /// edit applies to it (its `find` text occurs exactly once); it records the line where
    /// that text starts.
    async fn requested(&self, ctx: &Context, base: String, edit: Edit) -> Result<RequestedNext> {
        let line: u64 = ctx
            .step("apply", || async {
                self.check(&base, &edit)
                    .await
                    .map_err(loops::BoxError::from)
            })
            .await?;
        Ok(RequestedNext::Applied { edit, line })
    }
}

impl EditApplier {
    /// Whether `edit` applies to its file at `base`: the line where its `find` text starts.
    ///
    /// # Errors
    /// If its path is not a plain relative one, the file is not a regular UTF-8 file of
    /// `base`, the `find` text does not occur exactly once, or git fails.
    async fn check(&self, base: &str, edit: &Edit) -> Result<u64> {
        check_edit_path(&edit.path)?;
        let (_, text) = self.git.file_at(base, &edit.path).await?;
        apply_edit(&text, edit)?;
        line_of(&text, &edit.find)
    }
}

/// The line (from 1) where `find` starts in `text`.
///
/// # Errors
/// If `find` does not occur in `text`, or the count does not fit a `u64`.
fn line_of(text: &str, find: &str) -> Result<u64> {
    let at = text
        .find(find)
        .context("the text to replace does not occur")?;
    let before = text.get(..at).unwrap_or_default().matches('\n').count();
    u64::try_from(before)
        .ok()
        .and_then(|n| n.checked_add(1))
        .context("the line number does not fit a u64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_from_one() {
        assert_eq!(line_of("a\nbc\nd", "a").unwrap(), 1);
        assert_eq!(line_of("a\nbc\nd", "c\nd").unwrap(), 2);
        assert_eq!(line_of("a\nbc\nd", "d").unwrap(), 3);
        assert!(line_of("a", "z").is_err());
    }

    #[test]
    fn child_ids_name_the_parent_and_the_place() {
        assert_eq!(edit_run_id("deliver-1", 0), "deliver-1/edit-0");
        assert_eq!(edit_run_id("deliver-1", 12), "deliver-1/edit-12");
        // The longest run ids still give valid child ids, distinct per run and per edit.
        let long = "é".repeat(loops::MAX_RUN_ID_BYTES / 2);
        let other = format!("{}x", &long[..long.len() - 2]);
        let ids = [
            edit_run_id(&long, 0),
            edit_run_id(&long, 1),
            edit_run_id(&other, 0),
        ];
        for id in &ids {
            loops::validate_run_id(id).unwrap();
            assert!(id.len() <= loops::MAX_RUN_ID_BYTES, "{id}");
        }
        assert!(ids[0].ends_with("/edit-0") && ids[1].ends_with("/edit-1"));
        assert_ne!(ids[0], ids[2]);
        assert!(ids.iter().all(|id| edit_parent(id).is_some()));
    }

    #[test]
    fn edit_run_ids_are_told_apart() {
        for id in ["deliver-1/edit-0", "a/b/edit-12", "x.0badcafe/edit-3"] {
            assert!(edit_parent(id).is_some(), "{id}");
        }
        for id in [
            "deliver-1",
            "edit-0",
            "a/edit-",
            "a/edit-1x",
            "a/edit-0/b",
            "a/edits-1",
        ] {
            assert!(edit_parent(id).is_none(), "{id}");
        }
    }
}
