//! A test that skips (not root, a tool missing) says so in the default `cargo test` output —
//! not only with `--nocapture` — and fails instead under `CI`. Checked by running this
//! binary's own probe test the way `cargo test` does, capture on.

use std::process::{Command, Stdio};

use crate::support::*;

/// Skips, saying why: run only by the tests below.
#[test]
#[ignore = "probe run by skipped_tests_are_visible_without_nocapture"]
fn skip_probe() {
    if skip(true, "the probe always skips") {
        return;
    }
    panic!("skip(true, ..) did not skip");
}

/// Runs `skip_probe` in a fresh process of this binary, output captured as by default.
fn run_probe(ci: Option<&str>) -> (bool, String) {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args([
        "--exact",
        "skips::skip_probe",
        "--include-ignored",
        "--test-threads=2",
    ])
    .env_remove("CI")
    .stdin(Stdio::null());
    if let Some(v) = ci {
        c.env("CI", v);
    }
    let out = c.output().expect("run the probe");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn skipped_tests_are_visible_without_nocapture() {
    let (ok, text) = run_probe(None);
    assert!(ok, "the probe failed:\n{text}");
    assert!(
        text.contains("SKIPPED skips::skip_probe") && text.contains("the probe always skips"),
        "the skip is not in the default output:\n{text}"
    );
    assert!(text.contains("1 passed"), "the probe did not run:\n{text}");
}

#[test]
fn under_ci_a_skip_is_a_failure() {
    let (ok, text) = run_probe(Some("true"));
    assert!(!ok, "the probe passed under CI:\n{text}");
    assert!(text.contains("required in CI but missing"), "{text}");
}
