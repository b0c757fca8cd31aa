//! Helpers shared by the `tests/cli_*.rs` suites: starting the real `leasehold` binary, waiting
//! for conditions with bounded polls (never a bare sleep as synchronisation), reading the lease,
//! and judging processes by /proc state (zombies count as dead: PID 1 here does not reap orphans).
#![allow(dead_code)]

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
    c
}

/// The same, wrapped for assert_cmd assertions.
pub fn lh_assert() -> assert_cmd::Command {
    assert_cmd::Command::from_std(lh())
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

/// Polls `cond` every few milliseconds until it holds; panics naming `what` after `limit`.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A child process that is killed and reaped when dropped (so a failing test leaves nothing).
pub struct Kid {
    pub child: Child,
    pub name: &'static str,
}

impl Kid {
    pub fn spawn(c: &mut Command, name: &'static str) -> Kid {
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Kid { child, name }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits (bounded) for it to exit and returns its status.
    #[track_caller]
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                Instant::now() < end,
                "{} did not exit within {limit:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Its captured stderr (after it exited).
    pub fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// Its captured stdout (after it exited).
    pub fn stdout(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stdout.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig);
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid()),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
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
    wait_until(
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

/// The state letter of a process, or None when it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// Alive = exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    matches!(proc_state(pid), Some(c) if !matches!(c, 'Z' | 'X' | 'x'))
}

/// Live (non-zombie) members of a process group.
pub fn group(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(i) = s.rfind(')') else { continue };
        let f: Vec<&str> = s[i + 1..].split_whitespace().collect();
        if f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
            && !matches!(f.first(), Some(&"Z") | Some(&"X"))
        {
            out.push(pid);
        }
    }
    out
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Prints why a test is skipped and returns true when not root.
pub fn skip_unless_root(test: &str) -> bool {
    if !is_root() {
        eprintln!("SKIP {test}: needs root (mount / signalling across users)");
        return true;
    }
    false
}

/// A waiting `leasehold run` holder whose command runs until the test removes `release`:
/// `touch ready; while [ -e release ]; do sleep 0.02; done`.
pub struct Holder {
    pub kid: Kid,
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
        let kid = Kid::spawn(
            lh().arg("run")
                .args(flags)
                .arg(lock)
                .arg("-c")
                .arg(script)
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            "holder",
        );
        wait_until(
            "the holder's command to start",
            Duration::from_secs(10),
            || ready.exists(),
        );
        Holder { kid, release }
    }

    /// Lets the command finish and returns the wrapper's exit status.
    pub fn finish(&mut self) -> ExitStatus {
        let _ = fs::remove_file(&self.release);
        self.kid.wait_exit(Duration::from_secs(10))
    }
}
