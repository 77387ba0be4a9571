//! Compile-fail tests of the derive's diagnostics: each `tests/ui/NAME.rs` must fail to compile
//! with exactly the message in `tests/ui/NAME.stderr` (regenerate with `TRYBUILD=overwrite`,
//! then read every changed file).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
