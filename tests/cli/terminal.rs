//! The command sees the terminal as it would without leasehold: through a real pseudo-terminal
//! (leasehold as a session leader with the pty as its controlling terminal, like a login shell's
//! job), an interactive prompt gets its answer, Ctrl-C reaches the command and then the caller
//! (leasehold dies of it, and a calling script stops before its next step), and
//! Ctrl-Z stops the job — the wrapper stops too, and once continued the command gets the
//! terminal back and still reads its answer.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::Signal;

/// A `leasehold` process on a fresh pty; the test holds the master side.
struct OnPty {
    kid: Proc,
    master: std::fs::File,
    seen: Arc<Mutex<String>>,
}

impl OnPty {
    fn start(args: &[&str]) -> OnPty {
        OnPty::start_program(&bin(), args)
    }

    /// `program ARGS...` as the session leader on a fresh pty (a login shell's job).
    fn start_program(program: &std::path::Path, args: &[&str]) -> OnPty {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        let mut c = Command::new(program);
        c.args(args)
            .stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                crate::support::cli::default_signals();
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY as _, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let kid = Proc::spawn(&mut c, "leasehold on a pty");
        drop(c);
        let master = std::fs::File::from(pty.master);
        let seen = Arc::new(Mutex::new(String::new()));
        let mut reader = master.try_clone().expect("dup master");
        let sink = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let _ = master.as_raw_fd();
        OnPty { kid, master, seen }
    }

    #[track_caller]
    fn expect(&self, text: &str) {
        ensure_within(
            &format!("{text:?} on the terminal"),
            Duration::from_secs(10),
            || self.seen.lock().unwrap().contains(text),
        );
    }

    fn type_(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).expect("write to the pty");
    }

    /// Waits (10 s at most) for the process to end, and asserts that it died of `sig`.
    #[track_caller]
    fn dies_of(&mut self, sig: Signal) {
        use std::os::unix::process::ExitStatusExt;
        let st = self.kid.wait_timeout(Duration::from_secs(10));
        assert_eq!(
            st.signal(),
            Some(sig as i32),
            "{st:?}: {}",
            self.transcript()
        );
    }

    fn transcript(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    /// `leasehold run --ttl TTL LOCK -c SCRIPT` on a terminal of its own.
    fn run(ttl: &str, lock: &std::path::Path, script: &str) -> OnPty {
        OnPty::start(&["run", "--ttl", ttl, lock.to_str().unwrap(), "-c", script])
    }

    /// Waits (10 s at most) for leasehold to exit, and asserts that it exited `code`.
    #[track_caller]
    fn exits(&mut self, code: i32) {
        let st = self.kid.wait_timeout(Duration::from_secs(10));
        assert_eq!(st.code(), Some(code), "{}", self.transcript());
    }
}

const PROMPT: &str = "printf 'Apply? '; read a; echo \"got:$a\"";

#[test]
fn an_interactive_prompt_gets_its_answer() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("tty.lock");
    let mut t = OnPty::run("2s", &lock, PROMPT);
    t.expect("Apply? ");
    t.type_(b"yes\n");
    t.expect("got:yes");
    t.exits(0);
}

#[test]
fn ctrl_c_reaches_the_command() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("int.lock");
    let mut t = OnPty::run("2s", &lock, "echo ready; exec sleep 100");
    t.expect("ready");
    ensure_within("the command to run sleep", Duration::from_secs(10), || {
        lease(&lock)
            .and_then(|l| l["holder"]["child_pid"].as_i64())
            .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
            .is_some_and(|c| c.trim() == "sleep")
    });
    t.type_(b"\x03");
    // As if the command had been in leasehold's own group: leasehold dies of the SIGINT too.
    t.dies_of(Signal::SIGINT);
}

/// A script at a terminal running `leasehold run L -- cmd; step2`: Ctrl-C ends the command and
/// the script (step2 never runs), as with `flock L cmd; step2`; the same for Ctrl-\.
#[test]
fn ctrl_c_and_ctrl_backslash_stop_the_calling_script() {
    for (key, sig) in [(b"\x03", Signal::SIGINT), (b"\x1c", Signal::SIGQUIT)] {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("script.lock");
        let script = format!(
            "'{}' run --ttl 2s '{}' -- sh -c 'echo ready; exec sleep 100'; echo step2; sleep 1",
            bin().display(),
            lock.display()
        );
        let mut t = OnPty::start_program(std::path::Path::new("/bin/sh"), &["-c", &script]);
        t.expect("ready");
        ensure_within("the command to run sleep", Duration::from_secs(10), || {
            lease(&lock)
                .and_then(|l| l["holder"]["child_pid"].as_i64())
                .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
                .is_some_and(|c| c.trim() == "sleep")
        });
        t.type_(key);
        t.dies_of(sig);
        assert!(!t.transcript().contains("step2"), "{}", t.transcript());
        assert_eq!(
            lease(&lock).and_then(|l| l["state"].as_str().map(String::from)),
            Some("released".into()),
            "the lease is released before the signal is passed on"
        );
    }
}

#[test]
fn ctrl_z_stops_the_job_and_fg_resumes_it() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("tstp.lock");
    // A TTL long enough that the suspension does not cost the lease.
    let mut t = OnPty::run("30s", &lock, PROMPT);
    t.expect("Apply? ");
    let (_, child, _) = wait_for_child(&lock);
    t.type_(b"\x1a");
    ensure_within("the command to stop", Duration::from_secs(10), || {
        proc_state(child) == Some('T')
    });
    ensure_within(
        "the wrapper to stop itself",
        Duration::from_secs(10),
        || proc_state(t.kid.pid()) == Some('T'),
    );
    // `fg`: continue the wrapper; it gives the terminal back to the command and continues it.
    t.kid.signal(Signal::SIGCONT);
    ensure_within(
        "the command to run again",
        Duration::from_secs(10),
        || matches!(proc_state(child), Some(s) if s != 'T'),
    );
    t.type_(b"yes\n");
    t.expect("got:yes");
    t.exits(0);
}

/// The distinct `held …` values shown on the terminal so far.
fn held_values(transcript: &str) -> std::collections::BTreeSet<String> {
    transcript
        .split("held ")
        .skip(1)
        .filter_map(|rest| rest.split(',').next())
        .filter(|v| v.len() < 12 && v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect()
}

/// On a terminal the wait line shows the holder's `--note`, labels the heartbeat age as this
/// host's observation, and keeps "held …" current while the spinner runs — even when the
/// waiter looks at the lock only every few seconds (TTL 60s: a look every 5s at most), as it
/// did not when the line froze at its first value.
#[test]
fn the_wait_line_shows_the_note_and_stays_current() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("wait.lock");
    let mut h = Holder::start(&lock, &["--ttl", "60s", "--note", "CI run 4242"]);
    let mut t = OnPty::start(&["run", "-w", "30s", lock.to_str().unwrap(), "--", "true"]);
    t.expect("[note: CI run 4242]");
    t.expect("heartbeat unchanged here for");
    ensure_within(
        "the wait line to show three different 'held' values",
        Duration::from_secs(10),
        || held_values(&t.transcript()).len() >= 3,
    );
    assert_eq!(h.finish().code(), Some(0));
    let st = t.kid.wait_timeout(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "{}", t.transcript());
}

/// Without a terminal (CI logs) the line is printed once per holder and state, however often
/// the waiter looks (a 400ms TTL: a look every 100ms).
#[test]
fn without_a_terminal_the_wait_line_is_printed_once_per_holder() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("plain.lock");
    let mut h = Holder::start(&lock, &["--ttl", "400ms", "--note", "CI run 7"]);
    let out = lh_assert()
        .args(["run", "-w", "1.5s"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(75);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("Blocking")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("[note: CI run 7]"), "{err}");
    assert_eq!(h.finish().code(), Some(0));
}

/// The flock drop-in at a terminal, as util-linux's: `flock L cmd; step2` in a script, Ctrl-C
/// ends the command and the script (step2 never runs), with `/usr/bin/flock` and the drop-in.
#[test]
fn ctrl_c_stops_a_script_around_the_flock_drop_in_as_around_util_linux_flock() {
    let real = std::path::Path::new("/usr/bin/flock");
    if skip(!real.exists(), "no /usr/bin/flock (util-linux)") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let ours = d.path().join("flock");
    std::os::unix::fs::symlink(bin(), &ours).unwrap();
    for flock in [real, ours.as_path()] {
        let lock = d.path().join("drop-in.lock");
        let script = format!(
            "'{}' '{}' sh -c 'echo ready; exec sleep 100'; echo step2; sleep 1",
            flock.display(),
            lock.display()
        );
        let mut t = OnPty::start_program(std::path::Path::new("/bin/sh"), &["-c", &script]);
        t.expect("ready");
        t.type_(b"\x03");
        t.dies_of(Signal::SIGINT);
        assert!(
            !t.transcript().contains("step2"),
            "{}: {}",
            flock.display(),
            t.transcript()
        );
    }
}
