use super::*;

const OLD: &str = "\
workflow deliver version 1
state Received (struct, initial) -> Planned | Abandoned
  issue: Issue
  issue.number: u64
state Tested (struct) -> Edited | Done
  report: Report
  report.passed: bool
  report.verdict: Verdict
  report.verdict::Pass: unit
state Done (unit, terminal)
state Abandoned (unit, terminal)
";

fn classes(diff: &SchemaDiff) -> Vec<(&str, &Class)> {
    diff.iter().map(|c| (c.text.as_str(), &c.class)).collect()
}

fn pending(state: &str) -> Class {
    Class::IfNoPendingRun {
        state: state.into(),
    }
}

#[test]
fn the_same_text_has_no_changes() {
    assert!(schema_diff(OLD, OLD).is_empty());
    // A description written before the header named the record format reads as format 1.
    let with_format = OLD.replacen("version 1", "version 1 format 1", 1);
    assert!(schema_diff(OLD, &with_format).is_empty());
}

#[test]
fn every_kind_of_change_is_named() {
    let new = "\
workflow deliver version 2
state Received (struct, initial) -> Planned
  issue: Issue
  issue.number: u32
state Tested (tuple, terminal) -> Edited | Done | Tested
  report: Report
  report.passed: bool
  report.log: String (default)
  report.verdict: Verdict
  report.verdict::Fail: unit
state Done as \"done\" (unit, terminal)
state Merged (unit, terminal)
";
    let diff = schema_diff(OLD, new);
    assert_eq!(
        classes(&diff),
        [
            ("version changed from 1 to 2", &Class::Compatible),
            (
                "state `Received`: may no longer move to `Abandoned`",
                &Class::Compatible
            ),
            (
                "state `Received`: field `issue.number` changed from `u64` to `u32`",
                &Class::Breaking
            ),
            (
                "state `Tested`: now a tuple variant (was struct)",
                &Class::Breaking
            ),
            ("state `Tested`: now terminal", &pending("Tested")),
            (
                "state `Tested`: may now move to `Tested`",
                &Class::Compatible
            ),
            (
                "state `Tested`: field `report.log: String (default)` added",
                &Class::Compatible
            ),
            (
                "state `Tested`: variant `report.verdict::Fail: unit` added",
                &Class::Compatible
            ),
            (
                "state `Tested`: variant `report.verdict::Pass: unit` removed",
                &Class::Breaking
            ),
            (
                "state `Done`: now stored as \"done\" (was \"Done\")",
                &pending("Done")
            ),
            ("state `Merged` added", &Class::Compatible),
            ("state `Abandoned` removed", &pending("Abandoned")),
        ]
    );
    assert_eq!(diff.pending_states(), ["Tested", "Done", "Abandoned"]);
    // The rename hint: `Merged` has the data `Abandoned` had.
    assert!(diff.changes()[11].reason.contains("if `Merged`"));
}

/// A field removed and one of the same type added beside it: the added one's reason says how
/// to keep old records if it is a rename; fields of other types, or elsewhere, get no hint.
#[test]
fn a_field_renamed_is_named_as_a_possible_rename() {
    let old = "workflow w version 1\nstate A (struct, initial, terminal)\n  title: String\n  n: u64\n  inner: Inner\n  inner.x: u8\n";
    let new = "workflow w version 1\nstate A (struct, initial, terminal)\n  name: String\n  count: u32\n  inner: Inner\n  inner.y: u64\n";
    let diff = schema_diff(old, new);
    let reasons: Vec<(&str, &str)> = diff
        .changes()
        .iter()
        .map(|c| (c.text.as_str(), c.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "state `A`: field `name: String` added",
                "records written before lack it; give it `#[serde(default)]` or make it an `Option`; if it is `title` renamed (removed, of the same type), keep its stored name with `#[serde(rename = \"title\")]`, or write a migration"
            ),
            (
                "state `A`: field `count: u32` added",
                "records written before lack it; give it `#[serde(default)]` or make it an `Option`"
            ),
            (
                "state `A`: field `inner.y: u64` added",
                "records written before lack it; give it `#[serde(default)]` or make it an `Option`"
            ),
            (
                "state `A`: field `title: String` removed",
                "records written before hold it, and its data would be dropped (a migration can drop it)"
            ),
            (
                "state `A`: field `n: u64` removed",
                "records written before hold it, and its data would be dropped (a migration can drop it)"
            ),
            (
                "state `A`: field `inner.x: u8` removed",
                "records written before hold it, and its data would be dropped (a migration can drop it)"
            ),
        ]
    );
}

#[test]
fn quoted_names_and_unknown_lines() {
    let old = "workflow w version 1\nstate A (struct, initial, terminal)\n  \"a: b\": u8\nsomething else\n";
    let new = "workflow w version 1 (tag = \"t\")\nstate A (struct, initial, terminal)\n  \"a: b\": u16\n";
    let diff = schema_diff(old, new);
    assert_eq!(
        classes(&diff),
        [
            (
                "workflow storage changed from `default` to `tag = \"t\"`",
                &Class::Breaking
            ),
            (
                "state `A`: field `\"a: b\"` changed from `u8` to `u16`",
                &Class::Compatible
            ),
            ("line `something else` removed", &Class::Breaking),
        ]
    );
}

#[test]
fn the_record_format_version_is_named() {
    let old = "workflow w version 1 format 1\nstate A (unit, initial, terminal)\n";
    let new = "workflow w version 1 format 2\nstate A (unit, initial, terminal)\n";
    assert_eq!(
        classes(&schema_diff(old, new)),
        [(
            "record format version changed from 1 to 2",
            &Class::Breaking
        )]
    );
}

#[test]
fn a_mismatch_always_says_something() {
    let d = SchemaDiff::of_mismatch(None, OLD);
    assert_eq!(
        classes(&d),
        [(
            "the stored schema has no description in the store",
            &Class::Breaking
        )]
    );
    let d = SchemaDiff::of_mismatch(Some(OLD), OLD);
    assert_eq!(
        classes(&d),
        [(
            "the schema hash changed but the descriptions show no difference",
            &Class::Breaking
        )]
    );
}

#[test]
fn lines_below_an_added_or_breaking_line_are_part_of_it() {
    let old = "workflow w version 1\nstate A (struct, initial, terminal)\n  x: Vec<String>\n";
    let new = "workflow w version 1\nstate A (struct, initial, terminal)\n  x: Vec<Item>\n  x[]: Item\n  x[].a: u8\n  y: Option<Item>\n  y.a: u8\n";
    assert_eq!(
        classes(&schema_diff(old, new)),
        [
            (
                "state `A`: field `x` changed from `Vec<String>` to `Vec<Item>`",
                &Class::Breaking
            ),
            (
                "state `A`: field `y: Option<Item>` added",
                &Class::Compatible
            ),
        ]
    );
}

#[test]
fn breaking_given_pending_states() {
    let new = "\
workflow deliver version 1
state Received (struct, initial) -> Planned
  issue: Issue
  issue.number: u64
state Tested (struct) -> Edited | Done
  report: Report
  report.passed: bool
  report.verdict: Verdict
  report.verdict::Pass: unit
state Done (unit, terminal)
";
    let diff = schema_diff(OLD, new);
    assert!(diff.is_compatible(|_| false));
    assert!(diff.is_compatible(|s| s == "Tested"));
    let stopped = diff.breaking(|s| s == "Abandoned");
    assert_eq!(stopped.texts(), ["state `Abandoned` removed"]);
    assert_eq!(
        stopped.to_string(),
        "state `Abandoned` removed (compatible if no pending run is in `Abandoned`: a pending run in it could not be resumed (a state no pending run is in may go))"
    );
}

#[test]
fn a_diff_round_trips_through_json_and_reads_in_a_refusal() {
    let diff = schema_diff(OLD, &OLD.replace("issue.number: u64", "issue.number: u128"));
    let json = serde_json::to_value(&diff).unwrap();
    assert_eq!(
        json,
        serde_json::json!([{
            "text": "state `Received`: field `issue.number` changed from `u64` to `u128`",
            "class": "compatible",
            "reason": "a `u128` reads every stored `u64`",
        }])
    );
    assert_eq!(serde_json::from_value::<SchemaDiff>(json).unwrap(), diff);
    let removed = schema_diff(OLD, &OLD.replace("state Abandoned (unit, terminal)\n", ""));
    let json = serde_json::to_value(&removed).unwrap();
    assert_eq!(json[0]["class"], "if_no_pending_run");
    assert_eq!(json[0]["state"], "Abandoned");
    assert_eq!(serde_json::from_value::<SchemaDiff>(json).unwrap(), removed);

    let err = crate::Error::SchemaMismatch {
        run_id: "r1".into(),
        workflow: "deliver".into(),
        stored: crate::SchemaHash::from_u64(1),
        compiled: crate::SchemaHash::from_u64(2),
        changes: diff,
    };
    assert_eq!(
        err.to_string(),
        "run `r1` of workflow `deliver` was recorded with schema 0000000000000001 but this build has 0000000000000002; refusing to read its records, to resume it or to report its end; changes: state `Received`: field `issue.number` changed from `u64` to `u128` (compatible: a `u128` reads every stored `u64`) (every change is compatible: list the old schema in the workflow's `accepts = [\"0000000000000001\"]` to drive the run as it is; or keep the old version registered, or write a migration: see docs/evolution.md)"
    );
}

#[test]
fn an_event_payload_is_classed_by_its_fields() {
    let old = "\
workflow w version 1
state A (struct, initial, terminal)
  n: u32
event approve: Approval
  by: String
";
    let with = |lines: &str| format!("{old}{lines}");
    // A field old payloads lack, that reads as its default: compatible.
    let diff = schema_diff(old, &with("  note: String (default)\n"));
    assert_eq!(
        classes(&diff),
        [(
            "event `approve`: payload `Approval`: field `note: String (default)` added",
            &Class::Compatible
        )]
    );
    assert!(diff.is_compatible(|_| true));
    // One that old payloads lack and that has no default: breaking.
    let diff = schema_diff(old, &with("  note: String\n"));
    assert_eq!(
        classes(&diff),
        [(
            "event `approve`: payload `Approval`: field `note: String` added",
            &Class::Breaking
        )]
    );
    // A field retyped in place is classed as a state's is.
    let diff = schema_diff(old, &old.replace("  by: String", "  by: u64"));
    assert_eq!(
        classes(&diff),
        [(
            "event `approve`: payload `Approval`: field `by` changed from `String` to `u64`",
            &Class::Breaking
        )]
    );
    // Another payload type: retyped, breaking.
    let diff = schema_diff(old, &old.replace("approve: Approval", "approve: Verdict"));
    assert_eq!(
        classes(&diff),
        [(
            "event `approve` retyped from `Approval` to `Verdict`",
            &Class::Breaking
        )]
    );
}
