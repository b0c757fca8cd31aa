//! Helpers for tests of the command line: starting the real `leasehold` binary, reading the
//! lease it writes, and a holder whose command runs until the test lets it finish.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use super::proc::Proc;
use super::wait::ensure_within;

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_leasehold"))
}

/// A `leasehold` command in its own process group (so that a developer's terminal never gets
/// involved: without a foreground terminal leasehold runs its command in the no-terminal mode),
/// with stdin closed.
pub fn lh() -> Command {
    let mut c = Command::new(bin());
    c.process_group(0).stdin(Stdio::null());
    // SAFETY: default_signals only calls signal(2), which is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            default_signals();
            Ok(())
        });
    }
    c
}

/// Resets the job-control and termination signals to their default action. leasehold (as
/// flock(1), nohup and every exec) keeps a signal its caller ignores ignored, and so does its
/// command; a test runner started in the background of a script (`&` ignores SIGINT and
/// SIGQUIT) or under nohup (SIGHUP) must not change what the signal tests see. Call it between
/// fork and exec (it is async-signal-safe).
pub fn default_signals() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for s in [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
        Signal::SIGTERM,
    ] {
        // SAFETY: setting a default disposition installs no handler.
        let _ = unsafe { signal(s, SigHandler::SigDfl) };
    }
}

/// The same, wrapped for assert_cmd assertions.
pub fn lh_assert() -> assert_cmd::Command {
    assert_cmd::Command::from_std(lh())
}

/// Runs `leasehold run PRE LOCK POST` (POST: `-- COMMAND...` or `-c SCRIPT`) to completion, for
/// assert_cmd assertions.
pub fn lh_run(pre: &[&str], lock: &Path, post: &[&str]) -> assert_cmd::assert::Assert {
    lh_assert()
        .arg("run")
        .args(pre)
        .arg(lock)
        .args(post)
        .assert()
}

/// SIGKILLs a `leasehold run` wrapper and waits until it is gone, its command `child` (which
/// dies with it, by PDEATHSIG) too, and its guardian has stopped the leftovers and let go.
#[track_caller]
pub fn kill_wrapper(wrapper: &mut Proc, child: i32) {
    let guardian = guardian_of(wrapper.pid());
    wrapper.signal(nix::sys::signal::Signal::SIGKILL);
    wrapper.wait_timeout(Duration::from_secs(5));
    ensure_within(
        "the command to die with its wrapper",
        Duration::from_secs(5),
        || !super::alive(child),
    );
    // The guardian keeps the wrapper's kernel lock on LOCK until it has stopped what the job
    // left behind; a run that looked before then would rightly wait behind it.
    if let Some(g) = guardian {
        ensure_within(
            "the wrapper's guardian to stop the leftovers and let go",
            Duration::from_secs(5),
            || !super::alive(g),
        );
    }
}

/// The guardian of the `leasehold run` wrapper `wrapper`: its child named `lh-guardian`, or
/// running `leasehold --leasehold-guardian` (an exec'd guardian, which names itself only once
/// it runs).
pub fn guardian_of(wrapper: i32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|p| {
            fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "lh-guardian")
                || fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.ends_with(b"\0--leasehold-guardian\0"))
        })
}

/// Whether the guardian `guardian` of a wrapper that is gone has taken the descriptors the
/// wrapper armed it with: it holds more than its standard three and its socket (it waits
/// dormant, holding only those, until the wrapper is gone, then reads them from the socket).
pub fn guardian_took_its_descriptors(guardian: i32) -> bool {
    fs::read_dir(format!("/proc/{guardian}/fd")).is_ok_and(|d| d.count() > 4)
}

/// SIGKILLs the guardian of the wrapper `wrapper` and waits until it is dead: for tests of what
/// a dead holder leaves behind when nothing stops it (its guardian gone too, as under the OOM
/// killer).
#[track_caller]
pub fn kill_guardian(wrapper: i32) {
    let g = guardian_of(wrapper).expect("the wrapper's guardian");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(g),
        nix::sys::signal::Signal::SIGKILL,
    );
    ensure_within("the guardian to die", Duration::from_secs(5), || {
        !super::alive(g)
    });
}

/// Assertions on captured stderr.
pub trait StderrHas {
    /// Asserts that stderr contains `needle`.
    fn stderr_has(self, needle: &str) -> Self;
}

impl StderrHas for assert_cmd::assert::Assert {
    #[track_caller]
    fn stderr_has(self, needle: &str) -> Self {
        let err = String::from_utf8_lossy(&self.get_output().stderr).into_owned();
        assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
        self
    }
}

/// The lease in LOCK as JSON, if it parses.
pub fn lease(lock: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&fs::read(lock).ok()?).ok()
}

/// Waits until the lease in LOCK names a running command; returns (wrapper pid, child pid, pgid).
#[track_caller]
pub fn wait_for_child(lock: &Path) -> (i32, i32, i32) {
    let mut out = None;
    ensure_within(
        "the lease to name the command",
        Duration::from_secs(10),
        || {
            let Some(l) = lease(lock) else { return false };
            if l["state"] != "held" {
                return false;
            }
            let h = &l["holder"];
            match (
                h["pid"].as_i64(),
                h["child_pid"].as_i64(),
                h["pgid"].as_i64(),
            ) {
                (Some(p), Some(c), Some(g)) => {
                    out = Some((p as i32, c as i32, g as i32));
                    true
                }
                _ => false,
            }
        },
    );
    out.expect("set by the poll")
}

/// Starts `leasehold run FLAGS LOCK -c SCRIPT` (stdout to /dev/null, stderr piped) as `name`.
pub fn run_sh(lock: &Path, flags: &[&str], script: &str, name: &str) -> Proc {
    Proc::spawn(
        lh().arg("run")
            .args(flags)
            .arg(lock)
            .arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        name,
    )
}

/// A waiting `leasehold run` holder whose command runs until the test removes `release`:
/// `touch ready; while [ -e release ]; do sleep 0.02; done`.
pub struct Holder {
    pub kid: Proc,
    pub release: PathBuf,
}

impl Holder {
    /// Starts a holder of `lock` with extra `run` flags and waits until its command runs.
    pub fn start(lock: &Path, flags: &[&str]) -> Holder {
        let dir = lock.parent().expect("lock has a directory");
        let name = lock
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let ready = dir.join(format!("{name}.ready"));
        let release = dir.join(format!("{name}.release"));
        let _ = fs::remove_file(&ready);
        fs::write(&release, "").expect("write release file");
        let script = format!(
            "touch '{}'; while [ -e '{}' ]; do sleep 0.02; done",
            ready.display(),
            release.display()
        );
        let kid = run_sh(lock, flags, &script, "holder");
        ensure_within(
            "the holder's command to start",
            Duration::from_secs(10),
            || ready.exists(),
        );
        Holder { kid, release }
    }

    /// Lets the command finish and returns the wrapper's exit status.
    pub fn finish(&mut self) -> ExitStatus {
        let _ = fs::remove_file(&self.release);
        self.kid.wait_timeout(Duration::from_secs(10))
    }
}
