//! What a first-time user reads, through the real binary:
//! - `run LOCK` with no command (or with the command but no `--`) says how to give one, exit 64;
//!   a mistyped option, or a stray word before `--`, gets no such (false) hint;
//! - a TTL too short for its margins asks for a longer TTL, not "shorten --ttl";
//! - durations are printed rounded (`gave up after 1.5s`, timing refusals), never as Rust's
//!   `1.500907219s`;
//! - `break --lease-id` with an id that does not match says so (it may be a typo), never that
//!   the lease "changed hands"; a broken or revoked lease's record and `status` (readable and
//!   `--json` reason) name who broke it (user, host, pid);
//! - `status` on a LOCK that does not exist says so and creates nothing beside it;
//! - a run SIGKILLed while its command's leftovers still run: a contender's refusal names the
//!   dead run's guardian that keeps LOCK's kernel lock until they are stopped, not "another
//!   program".

use std::time::Duration;

use crate::support::*;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

#[test]
fn a_missing_command_says_how_to_give_one_with_exit_64() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    let want = "no command: put it after `--`, or use -c 'SHELL COMMAND'";
    let a = lh_assert().arg("run").arg(&lock).assert().code(64);
    let err = stderr_of(&a);
    assert!(err.contains(want), "run LOCK: {err}");
    assert!(!err.contains("--command <"), "clap's own wording: {err}");
    // The command given without `--`.
    let a = lh_assert()
        .arg("run")
        .arg(&lock)
        .args(["echo", "hi"])
        .assert()
        .code(64);
    assert!(
        stderr_of(&a).contains(want),
        "run LOCK CMD: {}",
        stderr_of(&a)
    );
    assert!(!lock.exists(), "a usage error took the lock");
}

/// The "put it after `--`" hint only where it is true: not for a mistyped option, nor once
/// `--` is on the line.
#[test]
fn a_mistyped_option_gets_no_missing_command_hint() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    for args in [
        &["--no-wiat"][..],
        &["--no-wiat", "-c", "true"],
        &["-n", "--bogus"],
    ] {
        let a = lh_assert()
            .arg("run")
            .args(args)
            .arg(&lock)
            .args(["--", "true"])
            .assert()
            .code(64);
        let err = stderr_of(&a);
        assert!(err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(!err.contains("no command"), "{args:?}: {err}");
    }
    // `run LOCK -- cmd` followed by a stray word is fine, and a stray word before `--` is not
    // the command either.
    let a = lh_assert()
        .arg("run")
        .arg(&lock)
        .args(["stray", "--", "true"])
        .assert()
        .code(64);
    assert!(!stderr_of(&a).contains("no command"), "{}", stderr_of(&a));
    assert!(!lock.exists(), "a usage error took the lock");
}

/// A TTL too short for its own heartbeat and margins asks for a longer TTL only (never
/// "shorten --ttl or lengthen --ttl"); a heartbeat too long for its TTL names both ways out.
#[test]
fn a_too_short_ttl_asks_only_for_a_longer_one() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    let a = lh_assert()
        .arg("run")
        .args(["--ttl", "1ms"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(64);
    let err = stderr_of(&a);
    assert!(err.contains("; lengthen --ttl"), "{err}");
    assert!(!err.contains("shorten --ttl"), "{err}");
    let a = lh_assert()
        .arg("run")
        .args(["--ttl", "1s", "--heartbeat", "2s"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(64);
    let err = stderr_of(&a);
    assert!(
        err.contains("shorten --heartbeat or lengthen --ttl"),
        "{err}"
    );
}

/// True when `s` holds a duration printed with more than 3 decimals (Rust's `{:?}`).
fn has_raw_duration(s: &str) -> bool {
    let b = s.as_bytes();
    b.windows(5).enumerate().any(|(i, w)| {
        w[0] == b'.'
            && w[1..].iter().all(u8::is_ascii_digit)
            && b[i + 5..]
                .iter()
                .find(|c| !c.is_ascii_digit())
                .is_some_and(|&c| c == b's' || c == b'm' || c == b'n' || c == b'\xc2')
    })
}

#[test]
fn durations_are_printed_rounded() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    let mut h = Holder::start(&lock, &[]);
    let a = lh_assert()
        .arg("run")
        .args(["-w", "0.3"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(75);
    let err = stderr_of(&a);
    // How long it waited (about the 300ms asked for, more on a busy machine): said, rounded.
    assert!(err.contains("gave up after "), "{err}");
    assert!(!has_raw_duration(&err), "a raw duration: {err}");
    h.finish();
    // A timing refusal names rounded values too.
    let a = lh_assert()
        .arg("run")
        .args(["--ttl", "1.0001", "--heartbeat", "0.9001"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(64);
    let err = stderr_of(&a);
    assert!(err.contains("--heartbeat"), "{err}");
    assert!(!has_raw_duration(&err), "a raw duration: {err}");
}

#[test]
fn raw_duration_detector_detects() {
    assert!(has_raw_duration("gave up after 1.500907219s: held"));
    assert!(!has_raw_duration("gave up after 1.5s: held"));
    assert!(!has_raw_duration("at 2026-11-30T22:09:02.182691Z"));
}

#[test]
fn a_wrong_lease_id_is_called_a_mismatch_and_breaks_nothing() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    let mut h = Holder::start(&lock, &[]);
    let before = lease(&lock).expect("lease");
    let wrong = "0123456789abcdef0123456789abcdef";
    let a = lh_assert()
        .args(["break", "--lease-id", wrong])
        .arg(&lock)
        .assert()
        .code(75);
    let err = stderr_of(&a);
    assert!(err.contains("does not match"), "{err}");
    assert!(err.contains("typo"), "{err}");
    assert!(err.contains(wrong), "{err}");
    assert!(!err.contains("changed hands"), "{err}");
    assert_eq!(lease(&lock).expect("lease")["state"], "held");
    assert_eq!(lease(&lock).expect("lease")["lease_id"], before["lease_id"]);
    h.finish();
}

/// `user@host pid N` of this test's `leasehold break`, as the record names it.
fn breaker_prefix() -> String {
    let me = leasehold::Identity::current();
    format!("{}@{} pid ", me.user, me.host)
}

#[test]
fn a_broken_lease_names_who_broke_it_in_record_and_status() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    // A live lease revoked by force: its holder's release keeps who revoked it.
    let mut h = Holder::start(&lock, &[]);
    let a = lh_assert()
        .args(["break", "--force"])
        .arg(&lock)
        .assert()
        .success();
    let who = stderr_of(&a);
    assert!(who.contains("revoked"), "{who}");
    h.finish();
    ensure_within(
        "the revoked lease to be released",
        Duration::from_secs(20),
        || lease(&lock).is_some_and(|l| l["state"] == "released"),
    );
    let l = lease(&lock).expect("lease");
    let by = l["ended"]["by"].as_str().unwrap_or_default().to_string();
    assert!(by.starts_with(&breaker_prefix()), "ended.by = {by:?}");
    let out = lh_assert()
        .args(["status", "--json"])
        .arg(&lock)
        .assert()
        .success();
    let j: serde_json::Value =
        serde_json::from_slice(&out.get_output().stdout).expect("status JSON");
    let reason = j["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("ended by {by}")),
        "reason: {reason}"
    );
    assert_eq!(j["ended"]["by"], by.as_str());
    let out = lh_assert().arg("status").arg(&lock).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains(&by),
        "status does not name the breaker:\n{text}"
    );
}

#[test]
fn status_of_a_missing_lock_says_so_and_creates_nothing() {
    let d = tmp();
    let list = || {
        let mut v: Vec<String> = std::fs::read_dir(d.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let lock = d.path().join("never-used.lock");
    let before = list();
    let out = lh_assert().arg("status").arg(&lock).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains("does not exist"), "{text}");
    let out = lh_assert()
        .args(["status", "--json"])
        .arg(&lock)
        .assert()
        .success();
    let j: serde_json::Value =
        serde_json::from_slice(&out.get_output().stdout).expect("status JSON");
    assert!(
        j["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("does not exist"),
        "{j}"
    );
    assert_eq!(list(), before, "status created something");
    // A missing directory: said so (exit 66), and not created.
    let gone = d.path().join("no-such-dir");
    let a = lh_assert()
        .arg("status")
        .arg(gone.join("x.lock"))
        .assert()
        .code(66);
    assert!(stderr_of(&a).contains("No such file"), "{}", stderr_of(&a));
    assert!(!gone.exists(), "status created the directory");
    assert_eq!(list(), before, "status created something");
}

/// A run whose wrapper is SIGKILLed alone leaves a process that ignores SIGTERM; its guardian
/// keeps the wrapper's kernel lock on LOCK through the grace, until that process is stopped.
/// `status` meanwhile names the guardian as what keeps LOCK locked — not "another program
/// (flock(1)?)", nor "a process this host cannot name" (before, /proc/locks named only the dead
/// wrapper) — and a run goes once the leftover is gone.
#[test]
fn status_behind_a_dead_runs_guardian_names_the_guardian() {
    let d = tmp();
    let lock = d.path().join("job.lock");
    let bg = d.path().join("bg");
    let job = format!(
        "trap '' TERM; sleep 300 & echo $! > '{b}.tmp'; mv '{b}.tmp' '{b}'; wait",
        b = bg.display()
    );
    let mut w = Proc::spawn(
        lh().args(["run", "--ttl", "120s", "--grace", "60s"])
            .arg(&lock)
            .args(["--", "sh", "-c", &job])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        "the run to kill",
    );
    ensure_within("the leftover to start", Duration::from_secs(10), || {
        bg.exists()
    });
    let left: i32 = std::fs::read_to_string(&bg)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let guardian = guardian_of(w.pid()).expect("the wrapper's guardian");
    let wrapper = w.pid();
    // The command itself (the wrapper's other child): PDEATHSIG kills it with the wrapper.
    let command = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
        .unwrap()
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|&p| p != guardian)
        .expect("the command");
    w.signal(nix::sys::signal::Signal::SIGKILL);
    w.wait_timeout(Duration::from_secs(5));
    // Until that signal has done its work the command lives, and `status` rightly calls the
    // holder alive (seen once in CI, 13 ms after the take on a loaded machine).
    ensure_within(
        "the command to die with the wrapper",
        Duration::from_secs(10),
        || !alive(command),
    );
    // The guardian, dormant until the wrapper was gone, takes the wrapper's lock from its
    // socket only then; until it has, the lock is kept by a descriptor in flight, which `status`
    // cannot name.
    ensure_within(
        "the guardian to take the wrapper's descriptors",
        Duration::from_secs(10),
        || guardian_took_its_descriptors(guardian),
    );
    let said =
        format!("the guardian (pid {guardian}) of leasehold run pid {wrapper}, which is gone");
    let out = lh_assert().arg("status").arg(&lock).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains(&said), "status names the guardian: {text}");
    assert!(!text.contains("another program"), "{text}");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(left),
        nix::sys::signal::Signal::SIGKILL,
    );
    ensure_within("the guardian to let go", Duration::from_secs(10), || {
        !alive(guardian)
    });
    lh_run(&["-n"], &lock, &["--", "true"]).success();
}
