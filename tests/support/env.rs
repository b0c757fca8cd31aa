//! What the environment offers: root, tools on PATH, and whether a missing one skips the test
//! (a developer's machine) or fails it (CI, where `.ci/run` exports `CI=true`).

/// True when running under CI (`CI` set to anything but empty, `0` or `false`).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// When `missing` is true: in CI, fail; otherwise say so on the terminal and return true (skip).
///
/// The line is `SKIPPED <test name> (<file:line>): <why>`, and it shows in the default
/// `cargo test` output: libtest captures what the print macros (`eprintln!`) write, showing it
/// only for a failing test or with `--nocapture`, but not writes to the stderr handle itself,
/// which go straight to the terminal. (libtest runs each test on a thread named after it.)
#[track_caller]
pub fn skip(missing: bool, why: &str) -> bool {
    if !missing {
        return false;
    }
    let at = std::panic::Location::caller();
    if ci() {
        panic!("required in CI but missing ({at}): {why}");
    }
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("a test");
    say_skipped(name, &at.to_string(), why);
    true
}

/// Writes `SKIPPED <what> (<at>): <why>` to the stderr handle itself (see [`skip`]): for tests
/// that did not run, including whole modules not built (`etcd::` without `--features etcd`),
/// which are no failure in CI (it runs them in a step of their own).
pub fn say_skipped(what: &str, at: &str, why: &str) {
    use std::io::Write as _;
    let line = format!("SKIPPED {what} ({at}): {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips unless root (and fails in CI, which runs as root).
#[track_caller]
pub fn need_root() -> bool {
    skip(!is_root(), "needs root (mounts, namespaces, other users)")
}

/// Whether `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Skips (fails in CI) when one of `tools` is not on PATH.
#[track_caller]
pub fn need_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    skip(
        !missing.is_empty(),
        &format!(
            "missing tools: {} (Debian: util-linux, mount, e2fsprogs, coreutils, passwd)",
            missing.join(", ")
        ),
    )
}
