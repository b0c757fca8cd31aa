//! The one worker protocol: a test binary re-runs itself as a worker process.
//!
//! Each test binary has, at its root, an ignored `#[test] fn worker()` calling [`run`] with the
//! roles it offers (the shared ones plus its own). [`cmd`] builds the command
//! `TEST-BINARY --exact worker --include-ignored --nocapture --test-threads=1 --quiet` with
//! [`ROLE`] naming the role (without [`ROLE`], `worker` returns at once). A role is a function
//! returning the worker's exit status; a panic in it fails the `worker` test, so the process
//! exits non-zero (101), never 0. Workers report facts to the test as stdout lines starting
//! with a keyword (`READY`, `LOST`, `OUTCOME`, ...) or through files; everything else libtest
//! prints is ignored.

use std::io::Write;
use std::process::Command;

/// Environment variable that turns a test binary run into a worker.
pub const ROLE: &str = "LEASEHOLD_TEST_ROLE";

/// A role: the worker's body, returning its exit status.
pub type Role = fn() -> i32;

/// The worker role this process was started in, if any.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// A command re-running this test binary as a worker in `role`.
pub fn cmd(role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args([
        "--exact",
        "worker",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ])
    .env(ROLE, role);
    c
}

/// Prints one protocol line on stdout, flushed at once.
pub fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// The body of each binary's `worker` test: runs the role named by [`ROLE`] and exits with its
/// status; returns at once when [`ROLE`] is unset. An unknown role exits 70.
pub fn run(roles: &[(&str, Role)]) {
    let Some(role) = role() else { return };
    let code = match roles.iter().find(|(name, _)| *name == role) {
        Some((_, body)) => body(),
        None => {
            eprintln!("unknown worker role {role:?}");
            70
        }
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}
