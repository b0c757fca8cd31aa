//! Contention through the real binary: -n and -w against a live holder (exit 75 or -E, the
//! one-line `Blocking waiting for lock ...` report, only when contended), a waiter that gets the
//! lock when the holder finishes, signals forwarded to the command with the lease released only
//! after it exits, `status` (readable and --json, one or several locks) and `break` (stale only,
//! by --lease-id, --force; refusals exit 75; tokens keep growing); a waiter starts its lease's
//! keeper threads while it waits, not after its turn.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Synchronises on a waiter's own report that it is blocked: its first stderr line, which must
/// be the `Blocking waiting for lock ...` line. Returns it with the stderr reader, which the
/// caller keeps open for as long as the waiter runs.
fn blocked_line(w: &mut Proc) -> (String, BufReader<std::process::ChildStderr>) {
    let mut err = BufReader::new(w.take_stderr().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("read waiter stderr");
    assert!(line.starts_with("Blocking waiting for lock "), "{line}");
    (line, err)
}

#[test]
fn no_wait_and_wait_against_a_live_holder() {
    let d = tmp();
    let lock = d.path().join("busy.lock");
    let mut h = Holder::start(&lock, &["--ttl", "1s"]);

    // -n: at once, 75, saying who holds it.
    let t = Instant::now();
    lh_assert()
        .args(["run", "-n"])
        .arg(&lock)
        .args(["--", "touch"])
        .arg(d.path().join("must-not-run"))
        .assert()
        .code(75)
        .stderr_has("held by");
    assert!(t.elapsed() < Duration::from_secs(1), "-n must not wait");
    // -E changes the conflict status; -q silences the report.
    lh_assert()
        .args(["run", "-n", "-q", "-E", "3"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(3)
        .stderr("");
    // -w gives up after about DURATION, having said once that it waits.
    let t = Instant::now();
    let out = lh_assert()
        .args(["run", "-w", "400ms", "-E", "99"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(99);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(400),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(3), "gave up after {waited:?}");
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    let blocking: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("Blocking waiting for lock "))
        .collect();
    assert_eq!(blocking.len(), 1, "{err}");
    assert!(blocking[0].contains("held by "), "{err}");
    assert!(blocking[0].contains("heartbeat"), "{err}");
    assert!(!d.path().join("must-not-run").exists());

    assert_eq!(h.finish().code(), Some(0));
    // Uncontended: no Blocking line at all.
    lh_assert()
        .args(["run", "-w", "5s"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .success()
        .stderr("");
}

#[test]
fn waiter_gets_the_lock_when_the_holder_finishes() {
    let d = tmp();
    let lock = d.path().join("queue.lock");
    let mut h = Holder::start(&lock, &["--ttl", "1s", "--note", "first"]);
    let mut w = Proc::spawn(
        lh().args(["run", "-w", "20s", "--ttl", "1s"])
            .arg(&lock)
            .args(["-c", "echo second:$LEASEHOLD_TOKEN"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "waiter",
    );
    let (line, _err) = blocked_line(&mut w);
    assert!(line.contains("held by"), "{line}");
    let first_token = lease(&lock).expect("lease")["token"].as_u64().unwrap();
    assert_eq!(h.finish().code(), Some(0));
    let st = w.wait_timeout(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    let out = w.stdout();
    let tok: u64 = out.trim().trim_start_matches("second:").parse().unwrap();
    assert!(tok > first_token);
}

#[test]
fn signals_are_forwarded_and_the_lease_released_after_the_command_exits() {
    let d = tmp();
    for (sig, name, code) in [
        (Signal::SIGTERM, "TERM", 11),
        (Signal::SIGINT, "INT", 12),
        (Signal::SIGHUP, "HUP", 13),
        (Signal::SIGQUIT, "QUIT", 14),
    ] {
        let lock = d.path().join(format!("{name}.lock"));
        let ready = d.path().join(format!("{name}.ready"));
        // The command traps the signal, and takes a moment to clean up before exiting.
        let script = format!(
            "trap 'echo got {name}; sleep 0.2; exit {code}' {name}; touch '{}'; while :; do sleep 0.02; done",
            ready.display()
        );
        let mut c = lh();
        c.args(["run", "--ttl", "1s"])
            .arg(&lock)
            .arg("-c")
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut k = Proc::spawn(c, "wrapper");
        ensure_within("the command to start", Duration::from_secs(10), || {
            ready.exists()
        });
        k.signal(sig);
        // While the command cleans up, the lease is still held.
        let st = k.wait_timeout(Duration::from_secs(10));
        assert_eq!(st.code(), Some(code), "{name}: {}", k.stderr());
        assert_eq!(k.stdout().trim(), format!("got {name}"));
        let l = lease(&lock).expect("lease");
        assert_eq!(l["state"], "released");
        assert_eq!(l["ended"]["how"], format!("exit {code}"));
    }
}

#[test]
fn lease_is_held_until_a_slow_command_finishes_after_sigterm() {
    let d = tmp();
    let lock = d.path().join("slow.lock");
    let ready = d.path().join("ready");
    let cleaning = d.path().join("cleaning");
    let go = d.path().join("go");
    let script = format!(
        "trap 'touch {c}; while [ ! -e {g} ]; do sleep 0.02; done; exit 5' TERM; touch {r}; while :; do sleep 0.02; done",
        c = cleaning.display(),
        g = go.display(),
        r = ready.display()
    );
    let mut k = Proc::spawn(
        lh().args(["run", "--ttl", "1s"])
            .arg(&lock)
            .arg("-c")
            .arg(&script)
            .stderr(Stdio::piped()),
        "wrapper",
    );
    ensure_within("the command to start", Duration::from_secs(10), || {
        ready.exists()
    });
    k.signal(Signal::SIGTERM);
    ensure_within("the command to trap TERM", Duration::from_secs(10), || {
        cleaning.exists()
    });
    // A contender is refused while the command cleans up.
    lh_assert()
        .args(["run", "-n"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(75);
    std::fs::write(&go, "").unwrap();
    assert_eq!(k.wait_timeout(Duration::from_secs(10)).code(), Some(5));
    lh_assert()
        .args(["run", "-n"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .success();
}

#[test]
fn status_json_and_text() {
    let d = tmp();
    let lock = d.path().join("st.lock");
    let free = d.path().join("free.lock");
    let mut h = Holder::start(&lock, &["--ttl", "2s", "--note", "nightly deploy"]);
    let (wrapper, child, pgid) = wait_for_child(&lock);
    assert_eq!(wrapper, h.kid.pid());
    assert_eq!(child, pgid, "the command leads its own process group");

    let out = lh_assert()
        .args(["status", "--json"])
        .arg(&lock)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).expect("json");
    for field in [
        "path",
        "state",
        "reason",
        "token",
        "lease_id",
        "pid",
        "host",
        "user",
        "command",
        "note",
        "acquired_at",
        "heartbeat_at",
        "heartbeat_age_ms",
        "ttl_ms",
        "same_host",
    ] {
        assert!(v.get(field).is_some(), "status --json lacks {field}: {v}");
    }
    assert_eq!(v["state"], "held");
    assert_eq!(v["pid"], wrapper);
    assert_eq!(v["note"], "nightly deploy");
    assert_eq!(v["ttl_ms"], 2000);
    assert_eq!(v["same_host"], true);
    assert_eq!(v["command"][0], "/bin/sh");
    assert_eq!(v["path"], lock.to_str().unwrap());
    assert!(v["heartbeat_age_ms"].as_u64().is_some());

    // Several locks: an array, in order.
    let out = lh_assert()
        .args(["status", "--json"])
        .arg(&lock)
        .arg(&free)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    assert_eq!(v[0]["state"], "held");
    assert_eq!(v[1]["state"], "free");

    // Readable: holder, note; after release, the last holder and how its job ended.
    let out = lh_assert().arg("status").arg(&lock).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains(": held"), "{text}");
    assert!(text.contains(&format!("pid {wrapper}")), "{text}");
    assert!(text.contains("nightly deploy"), "{text}");
    assert_eq!(h.finish().code(), Some(0));
    let out = lh_assert().arg("status").arg(&lock).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains(": free"), "{text}");
    assert!(text.contains("last holder"), "{text}");
    assert!(text.contains("exit 0"), "{text}");
    // One unreadable lock makes the status non-zero.
    let bad = d.path().join("bad.lock");
    std::fs::write(&bad, "not json").unwrap();
    lh_assert()
        .args(["status", "--json"])
        .arg(&lock)
        .arg(&bad)
        .assert()
        .code(65);
}

#[test]
fn break_refuses_a_live_lease_unless_named_or_forced() {
    let d = tmp();
    let lock = d.path().join("br.lock");
    let mut h = Holder::start(&lock, &["--ttl", "1s"]);
    let (_, child, _) = wait_for_child(&lock);
    let l = lease(&lock).expect("lease");
    let id = l["lease_id"].as_str().unwrap().to_string();
    let token = l["token"].as_u64().unwrap();

    // Stale-only break of a live lease: refused, 75, with the way to do it.
    lh_assert()
        .arg("break")
        .arg(&lock)
        .assert()
        .code(75)
        .stderr_has("--lease-id");
    // The wrong id: refused.
    lh_assert()
        .args(["break", "--lease-id", "0123456789abcdef0123456789abcdef"])
        .arg(&lock)
        .assert()
        .code(75);
    // A fence would show within a heartbeat: wait for the holder's next renewal, then look.
    wait_for_renewal(&lock, Duration::from_secs(1));
    assert!(
        running(child),
        "a refused break must not touch the command (state {:?})",
        proc_state(child)
    );
    assert_eq!(
        lease(&lock).expect("lease")["lease_id"].as_str(),
        Some(id.as_str()),
        "a refused break must leave the lease"
    );
    // The right id: broken; the holder fences its command and exits 74.
    lh_assert()
        .args(["break", "--lease-id", &id])
        .arg(&lock)
        .assert()
        .success()
        .stderr_has("will fence");
    let st = h.kid.wait_timeout(Duration::from_secs(10));
    assert_eq!(st.code(), Some(74));
    let err = h.kid.stderr();
    assert!(err.contains("fenced"), "{err}");
    assert!(!alive(child));
    // The token sequence goes on.
    let out = lh_run(&[], &lock, &["-c", "echo $LEASEHOLD_TOKEN"]).success();
    let next: u64 = String::from_utf8_lossy(&out.get_output().stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(next > token);
    // Nothing to break on a free lock: refused.
    lh_assert().arg("break").arg(&lock).assert().code(75);
}

#[test]
fn break_of_a_stale_lease_and_run_reports_what_it_broke() {
    let d = tmp();
    let lock = d.path().join("stale.lock");
    // A holder that is SIGKILLed leaves a stale lease (its command dies with it).
    let mut h = Holder::start(&lock, &["--ttl", "30s"]);
    let (wrapper, child, _) = wait_for_child(&lock);
    kill_wrapper(&mut h.kid, child);
    // `run` breaks it at once (same host, processes gone) and says so.
    let out = lh_run(&[], &lock, &["--", "true"])
        .success()
        .stderr_has("broke stale lease");
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains(&format!("pid {wrapper}")), "{err}");
    // And `break` breaks a stale lease without confirmation.
    let mut h = Holder::start(&lock, &["--ttl", "30s"]);
    let (_, child, _) = wait_for_child(&lock);
    kill_wrapper(&mut h.kid, child);
    lh_assert()
        .arg("break")
        .arg(&lock)
        .assert()
        .success()
        .stderr_has("broke stale lease");
    let l = lease(&lock).expect("lease");
    assert_eq!(l["state"], "released");
}

/// The children of process `pid` (its main thread's list).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn a_waiting_runs_held_child_runs_nothing_and_dies_with_its_wrapper() {
    // `run` forks its command's process before it takes the lease, held at a gate until the
    // lease names it. While it waits, that process must run nothing; a SIGKILLed wrapper takes
    // it along (PDEATHSIG), and the command never runs.
    let d = tmp();
    let lock = d.path().join("held-child.lock");
    let marker = d.path().join("must-not-run");
    let mut h = Holder::start(&lock, &["--ttl", "5s"]);
    let mut w = Proc::spawn(
        lh().args(["run", "-w", "60s"])
            .arg(&lock)
            .args(["--", "touch"])
            .arg(&marker)
            .stderr(Stdio::piped()),
        "waiter",
    );
    let (_, _err) = blocked_line(&mut w);
    // Its children: the held command and its guardian (not armed yet: it exits on EOF).
    let kids = children_of(w.pid());
    // The guardian names itself (`lh-guardian`) once it runs, which on a loaded machine may be
    // after the waiter's first line.
    let mut guardian = None;
    ensure_within(
        "the waiter's guardian to name itself",
        Duration::from_secs(10),
        || {
            guardian = guardian_of(w.pid());
            guardian.is_some()
        },
    );
    let guardian = guardian.expect("set by the poll");
    let held: Vec<i32> = kids.iter().copied().filter(|&p| p != guardian).collect();
    assert_eq!(held.len(), 1, "the waiter's children: {kids:?}");
    let held = held[0];
    assert!(alive(held), "the held child {held}");
    assert!(!marker.exists());
    w.kill();
    ensure_within(
        "the held child and the guardian to die with their wrapper",
        Duration::from_secs(10),
        || !alive(held) && !alive(guardian),
    );
    assert!(h.finish().success());
    // The lock is free again and was never used by the killed waiter's command.
    lh_assert()
        .args(["run", "-n"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .success();
    assert!(!marker.exists(), "the held child ran the command");
}

/// The names of the threads of process `pid`.
fn thread_names(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim_end().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_waiting_run_starts_its_lease_keeper_while_it_waits_not_after_its_turn() {
    // The threads that keep a lease (renewer and watchdog) start while a contender waits, so
    // that the way from its wake-up into the lease — a hand-over, a takeover — does not pay for
    // two thread starts. Before its turn the waiter holds nothing they could renew.
    let d = tmp();
    let lock = d.path().join("warm.lock");
    let mut h = Holder::start(&lock, &["--ttl", "5s"]);
    let holder_pid = lease(&lock).expect("lease")["holder"]["pid"].clone();
    let mut w = Proc::spawn(
        lh().args(["run", "-w", "60s"])
            .arg(&lock)
            .args(["--", "true"])
            .stderr(Stdio::piped()),
        "waiter",
    );
    let (_, _err) = blocked_line(&mut w);
    let keeper = ["leasehold-renew", "leasehold-watch"];
    ensure_within(
        "the waiter's keeper threads to start while it waits",
        Duration::from_secs(10),
        || {
            let names = thread_names(w.pid());
            keeper.iter().all(|k| names.iter().any(|n| n == k))
        },
    );
    assert_eq!(
        lease(&lock).expect("lease")["holder"]["pid"],
        holder_pid,
        "the waiter took the lease before its turn"
    );
    assert!(h.finish().success());
    assert!(w.wait_timeout(Duration::from_secs(30)).success());
}

/// The queue tickets in LOCK's queue directory (`q-N` files; not the `q-N.lease` a waiter
/// prepares beside its own), sorted.
fn tickets(lock: &std::path::Path) -> Vec<String> {
    let name = lock.file_name().expect("name").to_string_lossy();
    let qdir = lock.with_file_name(format!(".{name}.leasehold-queue"));
    let mut v: Vec<String> = std::fs::read_dir(qdir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("q-") && !n.contains('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A waiting `run` sent SIGTERM, SIGINT, SIGHUP or SIGQUIT (a CI runner's cancel, Ctrl-C,
/// a closed terminal) gives up its place in the queue and ends by that very signal while the
/// holder still runs: its ticket is gone, its command never ran, and a waiter queued behind it
/// moves up (it is served when the holder finishes, not after a dead ticket times out).
#[test]
fn a_waiting_run_ended_by_a_signal_withdraws_its_queue_ticket_and_dies_by_it() {
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        let d = tmp();
        let lock = d.path().join("cancel.lock");
        let marker = d.path().join("must-not-run");
        let mut h = Holder::start(&lock, &["--ttl", "30s"]);
        let mut w = Proc::spawn(
            lh().args(["run"])
                .arg(&lock)
                .args(["--", "touch"])
                .arg(&marker)
                .stderr(Stdio::piped()),
            "waiter",
        );
        let (_, _err) = blocked_line(&mut w);
        assert_eq!(tickets(&lock).len(), 1, "{sig}: the waiter's ticket");
        let mut next = Proc::spawn(
            lh().args(["run"])
                .arg(&lock)
                .args(["--", "true"])
                .stderr(Stdio::piped()),
            "next waiter",
        );
        let (_, _err2) = blocked_line(&mut next);
        let before = tickets(&lock);
        assert_eq!(before.len(), 2, "{sig}: two tickets: {before:?}");
        w.signal(sig);
        let st = w.wait_timeout(Duration::from_secs(10));
        assert!(h.kid.try_wait().is_none(), "{sig}: the holder ended first");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            st.signal(),
            Some(sig as i32),
            "{sig}: the waiter ended by {st}, not by the signal: {}",
            w.stderr()
        );
        let after = tickets(&lock);
        assert_eq!(
            after,
            before[1..].to_vec(),
            "{sig}: the cancelled waiter's ticket is still there"
        );
        assert!(
            !marker.exists(),
            "{sig}: the cancelled waiter ran its command"
        );
        assert!(h.finish().success());
        let st = next.wait_timeout(Duration::from_secs(10));
        assert!(st.success(), "{sig}: the next waiter: {st}");
        assert!(
            tickets(&lock).is_empty(),
            "{sig}: tickets left: {:?}",
            tickets(&lock)
        );
    }
}
