//! Helpers shared by the tests that run the `deliver` example as a child process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The example binary, `target/<profile>/examples/deliver`, built once per test binary.
///
/// `cargo test` builds the example in test mode only (it has `test = true`, for its unit
/// tests), so the program itself is built here with `$CARGO build --example deliver`: a
/// no-op when it is up to date, and never a stale binary when it is not.
pub fn example() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = cargo_build(&["--example", "deliver"])
            .join("examples")
            .join(format!("deliver{}", std::env::consts::EXE_SUFFIX));
        assert!(path.exists(), "{} was not built", path.display());
        path
    })
}

/// Runs `$CARGO build --quiet ARGS` in the profile of this test binary, and returns that
/// profile's directory (`target/<profile>`).
pub fn cargo_build(args: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let profile = profile_dir
        .file_name()
        .expect("profile directory")
        .to_string_lossy()
        .into_owned();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build.args(["build", "--quiet"]).args(args);
    if profile != "debug" {
        build.args(["--profile", &profile]);
    }
    let output = build.output().expect("run cargo build");
    assert!(
        output.status.success(),
        "cargo build {} failed:\n{}",
        args.join(" "),
        describe(&output)
    );
    profile_dir.to_path_buf()
}

/// A child's exit status and output, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
