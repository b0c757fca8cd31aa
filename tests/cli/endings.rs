//! The lock remembers how the last holding ended (issue 30): `run --max-time` fences a command
//! that runs too long (exit 124, its group gone); the next command's `LEASEHOLD_PREVIOUS*` say
//! `released` with the status, `died`, `fenced` or `broken`; `--after-crash fail` refuses (79)
//! until `leasehold ack`; `--recover` runs only after an unclean ending, before the command;
//! `--once-per` allows one start per period across processes.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// `leasehold run FLAGS LOCK -c SCRIPT` to its end: (exit status, stdout, stderr).
fn run(lock: &Path, flags: &[&str], script: &str) -> (i32, String, String) {
    let o = lh()
        .arg("run")
        .args(flags)
        .arg(lock)
        .arg("-c")
        .arg(script)
        .output()
        .expect("run leasehold");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// What the next command sees: `PREVIOUS STATUS TOKEN HOST ENDED`, one word each (`-` when
/// empty).
const SHOW: &str = r#"for v in "$LEASEHOLD_PREVIOUS" "$LEASEHOLD_PREVIOUS_STATUS" "$LEASEHOLD_PREVIOUS_TOKEN" "$LEASEHOLD_PREVIOUS_HOST" "$LEASEHOLD_PREVIOUS_ENDED"; do printf '%s ' "${v:--}"; done"#;

/// The PREVIOUS values a plain run of LOCK sees now.
#[track_caller]
fn previous(lock: &Path) -> Vec<String> {
    let (code, out, err) = run(lock, &[], SHOW);
    assert_eq!(code, 0, "{err}");
    out.split_whitespace().map(String::from).collect()
}

/// `leasehold status --json LOCK`'s `last_ending`.
fn last_ending(lock: &Path) -> serde_json::Value {
    let o = lh()
        .args(["status", "--json"])
        .arg(lock)
        .output()
        .expect("status");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    v["last_ending"].clone()
}

/// A run fenced by `--max-time 200ms`: an unclean ending, quickly.
#[track_caller]
fn fenced_run(lock: &Path) {
    let (code, _, err) = run(lock, &["--max-time", "200ms"], "sleep 100");
    assert_eq!(code, 124, "{err}");
}

#[test]
fn max_time_fences_the_whole_group_and_exits_124_within_the_grace() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let gc = dir.path().join("gc");
    // A grandchild in the command's group that ignores SIGTERM: only the SIGKILL after the
    // grace ends it.
    let script = format!(
        "(trap '' TERM; sleep 100) & echo $! > '{gc}.tmp' && mv '{gc}.tmp' '{gc}'; sleep 100",
        gc = gc.display()
    );
    let started = Instant::now();
    let mut w = Proc::spawn(
        lh().args(["run", "--max-time", "1s", "--grace", "500ms"])
            .arg(&lock)
            .arg("-c")
            .arg(&script)
            .stderr(Stdio::piped()),
        "max-time run",
    );
    let (_, _, pgid) = wait_for_child(&lock);
    ensure_within("the grandchild's pid", Duration::from_secs(10), || {
        gc.exists()
    });
    // The lease shows the deadline while the command runs.
    let o = lh()
        .args(["status", "--json"])
        .arg(&lock)
        .output()
        .expect("status");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    let deadline = v["deadline"].as_str().expect("a deadline in status --json");
    let acquired = v["acquired_at"].as_str().expect("acquired_at");
    let d = leasehold::parse_rfc3339(deadline).expect("RFC 3339 deadline");
    let a = leasehold::parse_rfc3339(acquired).expect("RFC 3339 acquisition");
    assert_eq!(d.duration_since(a).ok(), Some(Duration::from_secs(1)));
    let text = lh().arg("status").arg(&lock).output().expect("status");
    assert!(String::from_utf8_lossy(&text.stdout).contains("deadline:"));

    let st = w.wait_timeout(Duration::from_secs(10));
    let took = started.elapsed();
    let err = w.stderr();
    assert_eq!(st.code(), Some(124), "{err}");
    assert!(err.contains("--max-time 1s"), "{err}");
    assert!(took >= Duration::from_secs(1), "fenced early: {took:?}");
    // The limit, the grace, and room for a loaded machine.
    assert!(took < Duration::from_secs(4), "fenced late: {took:?}");
    assert!(group(pgid).is_empty(), "left of the job: {:?}", group(pgid));
    let e = last_ending(&lock);
    assert_eq!(e["how"], "fenced", "{e}");
    assert!(
        e["detail"].as_str().unwrap_or("").contains("--max-time"),
        "{e}"
    );
}

#[test]
fn previous_after_a_clean_exit_with_status_3_is_released_3() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    assert_eq!(previous(&lock)[0], "none");
    let (code, _, err) = run(&lock, &[], "exit 3");
    assert_eq!(code, 3, "{err}");
    let token = lease(&lock).expect("lease")["token"]
        .as_u64()
        .expect("token");
    let p = previous(&lock);
    assert_eq!(p[0], "released", "{p:?}");
    assert_eq!(p[1], "3", "{p:?}");
    assert_eq!(p[2], token.to_string(), "{p:?}");
    assert_eq!(p[3], leasehold::Identity::current().host, "{p:?}");
    assert!(leasehold::parse_rfc3339(&p[4]).is_some(), "{p:?}");
    // And the status the command after that saw: 0.
    assert_eq!(previous(&lock)[..2], ["released", "0"]);
}

#[test]
fn previous_after_a_hand_over_to_a_waiter_keeps_the_exit_status() {
    // A waiting run is handed the lease in place (the released bit) only after exit 0; any
    // other status is written out, so the waiter sees it.
    for status in ["0", "3"] {
        let dir = tmp();
        let lock = dir.path().join("job.lock");
        let release = dir.path().join("release");
        let ready = dir.path().join("ready");
        std::fs::write(&release, "").expect("release file");
        let script = format!(
            "touch '{}'; while [ -e '{}' ]; do sleep 0.02; done; exit {status}",
            ready.display(),
            release.display()
        );
        let mut holder = run_sh(&lock, &[], &script, "holder");
        ensure_within("the holder to run", Duration::from_secs(10), || {
            ready.exists()
        });
        let mut waiter =
            Proc::spawn_collecting(lh().arg("run").arg(&lock).arg("-c").arg(SHOW), "waiter");
        let queue = dir.path().join(".job.lock.leasehold-queue");
        ensure_within("the waiter to queue", Duration::from_secs(10), || {
            std::fs::read_dir(&queue).is_ok_and(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().starts_with("q-"))
            })
        });
        std::fs::remove_file(&release).expect("let the holder finish");
        holder.wait_timeout(Duration::from_secs(10));
        let o = waiter.finish(Duration::from_secs(10));
        assert_eq!(o.code, 0, "{}", o.stderr);
        let words: Vec<&str> = o.stdout.split_whitespace().collect();
        assert_eq!(words[..2], ["released", status], "{}", o.stdout);
    }
}

#[test]
fn previous_after_sigkill_of_wrapper_and_command_is_died() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let mut w = Proc::spawn(
        lh().arg("run").arg(&lock).arg("-c").arg("sleep 100"),
        "victim",
    );
    let (_, child, _) = wait_for_child(&lock);
    let token = lease(&lock).expect("lease")["token"]
        .as_u64()
        .expect("token");
    kill_wrapper(&mut w, child);
    let p = previous(&lock);
    assert_eq!(p[0], "died", "{p:?}");
    assert_eq!(p[1], "-", "no status after a death: {p:?}");
    assert_eq!(p[2], token.to_string(), "{p:?}");
}

#[test]
fn previous_after_a_fence_is_fenced() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    fenced_run(&lock);
    let p = previous(&lock);
    assert_eq!(p[..2], ["fenced", "-"], "{p:?}");
}

#[test]
fn previous_after_break_is_broken() {
    // A live lease broken by force: its holder fences (74), and the record names the breaker.
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let mut h = Holder::start(&lock, &[]);
    lh_assert()
        .args(["break", "--force"])
        .arg(&lock)
        .assert()
        .success();
    let st = h.kid.wait_timeout(Duration::from_secs(10));
    assert_eq!(st.code(), Some(74));
    assert_eq!(last_ending(&lock)["how"], "broken");
    assert_eq!(previous(&lock)[0], "broken");

    // A stale lease broken (its wrapper and command killed).
    let lock = dir.path().join("stale.lock");
    let mut w = Proc::spawn(
        lh().arg("run").arg(&lock).arg("-c").arg("sleep 100"),
        "victim",
    );
    let (_, child, _) = wait_for_child(&lock);
    kill_wrapper(&mut w, child);
    lh_assert().arg("break").arg(&lock).assert().success();
    let e = last_ending(&lock);
    assert_eq!(e["how"], "broken", "{e}");
    assert!(e["by"].as_str().is_some_and(|b| b.contains('@')), "{e}");
    assert_eq!(previous(&lock)[0], "broken");
}

#[test]
fn after_crash_fail_refuses_until_ack_then_runs() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let ran = dir.path().join("ran");
    let touch = format!("touch '{}'", ran.display());
    // Clean endings never refuse.
    let (code, _, err) = run(&lock, &["--after-crash", "fail"], "true");
    assert_eq!(code, 0, "{err}");
    fenced_run(&lock);
    for _ in 0..2 {
        let (code, _, err) = run(&lock, &["--after-crash", "fail"], &touch);
        assert_eq!(code, 79, "{err}");
        assert!(err.contains("fenced"), "{err}");
        assert!(err.contains("leasehold ack"), "{err}");
        assert!(!ran.exists(), "the command ran after an unclean ending");
    }
    // The default runs anyway.
    let (code, out, err) = run(&lock, &[], "echo $LEASEHOLD_PREVIOUS");
    assert_eq!((code, out.trim()), (0, "fenced"), "{err}");
    // That run's clean end is the last ending now: make it unclean again, then ack.
    fenced_run(&lock);
    assert_eq!(last_ending(&lock)["needs_ack"], true);
    let o = lh().arg("ack").arg(&lock).output().expect("ack");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let e = last_ending(&lock);
    assert_eq!(e["how"], "fenced", "{e}");
    assert!(
        e["acked"]["by"].as_str().is_some_and(|b| b.contains('@')),
        "{e}"
    );
    let (code, _, err) = run(&lock, &["--after-crash", "fail"], &touch);
    assert_eq!(code, 0, "{err}");
    assert!(ran.exists());
    // Now clean: nothing to acknowledge.
    let o = lh().arg("ack").arg(&lock).output().expect("ack");
    assert_eq!(o.status.code(), Some(75));
}

#[test]
fn recover_runs_only_after_an_unclean_ending_and_before_the_command() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let log = dir.path().join("log");
    let rec = format!(
        "echo \"recover $LEASEHOLD_PREVIOUS $LEASEHOLD_TOKEN\" >> '{}'",
        log.display()
    );
    let cmd = format!("echo \"command $LEASEHOLD_TOKEN\" >> '{}'", log.display());
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // No ending yet, then a clean one: no recovery.
    for _ in 0..2 {
        let (code, _, err) = run(&lock, &["--recover", &rec], &cmd);
        assert_eq!(code, 0, "{err}");
    }
    assert!(
        lines().iter().all(|l| l.starts_with("command")),
        "{:?}",
        lines()
    );
    std::fs::remove_file(&log).expect("clear the log");

    // After a fence: the recovery first, under the same lease, then the command.
    fenced_run(&lock);
    let (code, _, err) = run(&lock, &["--recover", &rec], &cmd);
    assert_eq!(code, 0, "{err}");
    let l = lines();
    assert_eq!(l.len(), 2, "{l:?}");
    let token = l[1].strip_prefix("command ").expect("the command second");
    assert_eq!(l[0], format!("recover fenced {token}"));
    std::fs::remove_file(&log).expect("clear the log");

    // A failing recovery: its status, no command, and the ending stays unclean.
    fenced_run(&lock);
    let (code, _, err) = run(&lock, &["--recover", "exit 5"], &cmd);
    assert_eq!(code, 5, "{err}");
    assert!(lines().is_empty(), "{:?}", lines());
    assert_eq!(last_ending(&lock)["how"], "fenced");
    let (code, _, err) = run(&lock, &["--recover", &rec], &cmd);
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines().len(), 2, "{:?}", lines());
}

#[test]
fn once_per_allows_one_start_per_period_across_processes() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).expect("marks dir");
    // Two processes at once: one starts, the other (waiting its turn) is refused with 75.
    let procs: Vec<Proc> = (0..2)
        .map(|i| {
            Proc::spawn_collecting(
                lh().args(["run", "--once-per", "1h"])
                    .arg(&lock)
                    .arg("-c")
                    .arg(format!("touch '{}/{i}'; sleep 0.2", marks.display())),
                "once-per run",
            )
        })
        .collect();
    let mut codes: Vec<(i32, String)> = procs
        .into_iter()
        .map(|mut p| {
            let o = p.finish(Duration::from_secs(20));
            (o.code, o.stderr)
        })
        .collect();
    codes.sort();
    assert_eq!(codes[0].0, 0, "{codes:?}");
    assert_eq!(codes[1].0, 75, "{codes:?}");
    assert_eq!(std::fs::read_dir(&marks).expect("marks").count(), 1);
    // A later start within the hour: 75 saying when, or -E's status; the command never runs.
    let (code, _, err) = run(&lock, &["--once-per", "1h"], "touch never");
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("next start is allowed at"), "{err}");
    let (code, _, err) = run(
        &lock,
        &["--once-per", "1h", "-E", "0"],
        &format!("touch '{}/x'", marks.display()),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_dir(&marks).expect("marks").count(), 1);
    // A refused start is no start, and no ending: the last ending is still the first run's.
    assert_eq!(last_ending(&lock)["how"], "released");
    // A shorter period has passed since: allowed.
    let (code, _, err) = run(&lock, &["--once-per", "1ms"], "true");
    assert_eq!(code, 0, "{err}");
}

#[test]
fn lock_exports_how_the_last_holding_ended() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let (code, _, err) = run(&lock, &[], "exit 3");
    assert_eq!(code, 3, "{err}");
    let o = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "out=$('{}' lock -n '{}') || exit $?; eval \"$out\"; echo \"$LEASEHOLD_PREVIOUS $LEASEHOLD_PREVIOUS_STATUS\"",
            bin().display(),
            lock.display()
        ))
        .stdin(Stdio::null())
        .output()
        .expect("script");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "released 3",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_recovery_command_is_stopped_when_its_wrapper_is_killed() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let pid_file = dir.path().join("rpid");
    fenced_run(&lock);
    // The recovery's own child, in its group, and carrying the lease's environment.
    let rec = format!(
        "sleep 100 & echo $! > '{p}.tmp' && mv '{p}.tmp' '{p}'; wait",
        p = pid_file.display()
    );
    let mut w = Proc::spawn(
        lh().args(["run", "--grace", "200ms", "--recover", &rec])
            .arg(&lock)
            .arg("-c")
            .arg("true")
            .stderr(Stdio::null()),
        "recovering run",
    );
    ensure_within("the recovery to start", Duration::from_secs(10), || {
        pid_file.exists()
    });
    let sleeper: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(alive(sleeper));
    w.signal(nix::sys::signal::Signal::SIGKILL);
    w.wait_timeout(Duration::from_secs(5));
    ensure_within(
        "the guardian to stop the recovery",
        Duration::from_secs(10),
        || !alive(sleeper),
    );
}

/// A wall clock for an in-process waiter that, once armed, runs `then` inside its next reading
/// (and reads the real clock after it). The judgement of what LOCK holds reads the wall clock
/// first (`judged_at`), after the read under the mutex and before it looks at the holder's
/// processes: an armed clock puts whatever `then` does exactly between the two.
struct Between {
    armed: std::sync::atomic::AtomicBool,
    then: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Between {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Between")
    }
}

impl leasehold::Clock for Between {
    fn wall(&self) -> std::time::SystemTime {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
            && let Some(f) = self.then.lock().expect("clock's action").take()
        {
            f();
        }
        std::time::SystemTime::now()
    }
    fn boottime(&self) -> Duration {
        leasehold::SystemClock.boottime()
    }
}

/// The race a waiter inside the mutex used to lose: it reads LOCK held, its holder then
/// releases in place (one fchmod, outside the mutex, by design) and exits, and the waiter,
/// finding the holder's processes gone, took the lease over as from a dead holder — recording
/// `died` for a clean `exit 0` (and `--after-crash fail` then refused the next run). Here the
/// holder is a real `leasehold run`, made to end exactly between the waiter's read and its
/// judgement by the waiter's clock (see [`Between`]).
#[test]
fn a_release_between_a_waiters_read_and_its_judgement_is_released_not_died() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    let holder = std::sync::Arc::new(std::sync::Mutex::new(Some(Holder::start(&lock, &[]))));
    let h = std::sync::Arc::clone(&holder);
    let clock = std::sync::Arc::new(Between {
        armed: std::sync::atomic::AtomicBool::new(false),
        then: std::sync::Mutex::new(Some(Box::new(move || {
            let mut h = h.lock().expect("holder").take().expect("the holder, once");
            // Its command exits 0; the wrapper, seeing us queued, releases in place and exits
            // (reaped here: its pid is gone when the judgement looks).
            let st = h.finish();
            assert_eq!(st.code(), Some(0), "the holder's wrapper");
        }))),
    });
    let arm = std::sync::Arc::clone(&clock);
    let guard = leasehold::LeaseBuilder::new(&lock)
        .clock(clock.clone())
        .poll(true)
        // Told after each look that found it held (after it queued): the next look's judgement
        // is the one to put the holder's end in front of.
        .on_wait(move |_| arm.armed.store(true, std::sync::atomic::Ordering::SeqCst))
        .acquire_timeout(Duration::from_secs(20))
        .expect("the waiter takes the lease");
    assert!(
        holder.lock().expect("holder").is_none(),
        "the holder ended between the waiter's read and its judgement"
    );
    let prev = guard.previous().expect("an ending is known");
    assert_eq!(
        (prev.end, prev.exit_status()),
        (leasehold::EndKind::Released, Some(0)),
        "{prev:?}"
    );
    guard.release().expect("release");
    // And a run that refuses after a crash runs: nothing crashed.
    let (code, _, err) = run(&lock, &["--after-crash", "fail"], "true");
    assert_eq!(code, 0, "{err}");
}
