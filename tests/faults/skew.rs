//! Clock skew (root, unshare, libfaketime from Debian's `faketime`): holders and
//! contenders whose wall clock runs 10 minutes fast or slow (libfaketime.so.1 preloaded directly,
//! FAKETIME=±10m, FAKETIME_DONT_FAKE_MONOTONIC=1).
//! - A skewed foreign holder (own namespaces) is never broken over ≥ 5 TTLs, and once killed is
//!   taken over after about a TTL: no early break, no eternal lock.
//! - A skewed holder on this host is never broken while alive, and taken over at once when dead.
//! - Skewed one-shot contenders (fresh processes each time) never break a live foreign holder
//!   with a true clock, and together take it over within TTL + 1 s once it is dead.
//!
//! Every skewed party's skew is confirmed from the lease it wrote (`acquired_at` 10 minutes off),
//! so a libfaketime that did not load cannot pass for a skewed clock.

use crate::support;

use super::ns;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{LastChange, Proc};

const SKEWS: [&str; 2] = ["+10m", "-10m"];

fn prerequisites() -> Option<PathBuf> {
    if support::need_root() || support::need_tools(&["unshare", "hostname", "mount", "sh"]) {
        return None;
    }
    let lib = ns::libfaketime();
    if support::skip(
        lib.is_none(),
        "libfaketime.so.1 not found (Debian package `faketime`)",
    ) {
        return None;
    }
    lib
}

/// Removes what libfaketime leaves in /dev/shm for `pid` when killed (a later process with the
/// same PID would fail with `sem_open: File exists`).
fn clean_faketime_shm(pid: i32) {
    let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
    let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
}

/// Asserts that the lease in `lock` was written by a clock 10 minutes off (`acquired_at`).
#[track_caller]
fn assert_skewed(lock: &Path, skew: &str, who: &str) {
    let v = support::raw_lease(lock).unwrap_or_else(|| panic!("{skew}: no lease from {who}"));
    let at = leasehold::parse_rfc3339(v["acquired_at"].as_str().expect("acquired_at")).unwrap();
    let off = match at.duration_since(std::time::SystemTime::now()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    let want = if skew.starts_with('-') { -600.0 } else { 600.0 };
    assert!(
        (off - want).abs() < 60.0,
        "{skew}: {who}'s clock is off by {off:.0} s, not {want:.0} s (libfaketime not in effect?)"
    );
}

#[test]
fn skewed_foreign_holders_no_early_break_no_eternal_lock() {
    if prerequisites().is_none() {
        return;
    }
    let ttl = Duration::from_millis(300);
    for (i, skew) in SKEWS.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let work = tempfile::tempdir().unwrap();
        let host = format!("faults-skewed-{i}");
        let mut f = ns::spawn(&ns::Spec {
            faketime: Some(skew),
            ..ns::Spec::new(&lock, work.path(), &host, ttl)
        });
        ns::check_lease_is_foreign(&lock, &f);
        assert_skewed(&lock, skew, "the foreign holder");
        let mut seen = LastChange::new(&lock);
        let n = ns::never_broken(&lock, ttl, ttl * 5, &mut seen, skew);
        f.kid.kill();
        let killed = Instant::now();
        let g = ns::take_over(&lock, ttl, killed, &mut seen, skew);
        let since = seen.at.elapsed();
        assert!(
            since + Duration::from_millis(20) >= ttl,
            "{skew}: taken over {since:?} after the last heartbeat, before the TTL"
        );
        println!(
            "faults: clock skew: foreign holder at {skew}: never broken over 5 TTLs ({n} attempts), taken over {} ms after kill, {} ms after its last heartbeat (ttl_ms={})",
            killed.elapsed().as_millis(),
            since.as_millis(),
            ttl.as_millis()
        );
        g.release().unwrap();
    }
}

fn skewed_helper(lib: &Path, skew: &str, lock: &Path, ttl: Duration) -> Command {
    let mut c = support::worker::cmd("hold");
    c.env("LD_PRELOAD", lib)
        .env("FAKETIME", skew)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("FAULTS_LOCK", lock)
        .env("FAULTS_TTL_MS", ttl.as_millis().to_string())
        .stderr(Stdio::piped());
    c
}

#[test]
fn skewed_same_host_holder_never_broken_alive_taken_at_once_dead() {
    let Some(lib) = prerequisites() else {
        return;
    };
    let ttl = Duration::from_millis(300);
    let work = tempfile::tempdir().unwrap();
    for skew in SKEWS {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let ready = work.path().join(format!("{skew}.ready"));
        let mut c = skewed_helper(&lib, skew, &lock, ttl);
        c.env("FAULTS_WAIT_MS", "5000").env("FAULTS_READY", &ready);
        let mut h = Proc::spawn(&mut c, "skewed holder");
        assert!(
            support::wait_until(Duration::from_secs(5), || ready.exists()
                || h.try_wait().is_some()),
            "skewed holder never got the lock"
        );
        assert!(h.try_wait().is_none(), "skewed holder exited");
        assert_skewed(&lock, skew, "the same-host holder");
        let what = format!("{skew} (same-host holder)");
        let n = ns::never_broken(&lock, ttl, ttl * 5, &mut LastChange::new(&lock), &what);
        let pid = h.pid();
        h.kill();
        clean_faketime_shm(pid);
        let t = Instant::now();
        let g = leasehold::LeaseBuilder::new(&lock)
            .ttl(ttl)
            .acquire_timeout(ttl + Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{skew}: dead same-host holder not taken over: {e}"));
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(100),
            "{skew}: took {took:?} for a dead same-host holder"
        );
        println!(
            "faults: clock skew: same-host holder at {skew}: never broken over 5 TTLs ({n} attempts), taken over {} ms after its death",
            took.as_millis()
        );
        g.release().unwrap();
    }
}

#[test]
fn skewed_one_shot_contenders_never_break_live_and_take_dead() {
    let Some(lib) = prerequisites() else {
        return;
    };
    let ttl = Duration::from_millis(300);
    for (i, skew) in SKEWS.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let work = tempfile::tempdir().unwrap();
        let host = format!("faults-true-clock-{i}");
        let mut f = ns::spawn(&ns::Spec::new(&lock, work.path(), &host, ttl));
        // One fresh skewed `leasehold run -n` per attempt. Exit 75 = refused, 0 = got it.
        let one_shot = || -> i32 {
            let mut c = Command::new(support::bin());
            c.args(["run", "-n", "-q", "--ttl", "300ms"])
                .arg(&lock)
                .args(["--", "true"])
                .env("LD_PRELOAD", &lib)
                .env("FAKETIME", skew)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut k = Proc::spawn(&mut c, "skewed contender");
            let pid = k.pid();
            let st = k.wait_timeout(Duration::from_secs(10));
            clean_faketime_shm(pid);
            support::code(st)
        };
        let end = Instant::now() + ttl * 5;
        let mut n = 0;
        let mut seen = LastChange::new(&lock);
        while Instant::now() < end {
            seen.poll();
            let c = one_shot();
            assert_eq!(
                c, 75,
                "{skew}: a skewed contender did not refuse a live holder"
            );
            n += 1;
        }
        f.kid.kill();
        let killed = Instant::now();
        let since = loop {
            let at = seen.poll();
            let c = one_shot();
            if c == 0 {
                break at.elapsed();
            }
            assert_eq!(c, 75, "{skew}: skewed contender failed");
            assert!(
                killed.elapsed() <= ttl + Duration::from_secs(1),
                "{skew}: skewed contenders never took over a dead foreign holder (eternal lock)"
            );
        };
        assert_skewed(&lock, skew, "the one-shot contender that took over");
        // A one-shot may have seen the last heartbeat one spawn (a few ms) before we did.
        assert!(
            since + Duration::from_millis(40) >= ttl,
            "{skew}: taken over {since:?} after the last heartbeat, before the TTL"
        );
        println!(
            "faults: clock skew: one-shot contenders at {skew}: refused a live foreign holder {n} times over 5 TTLs, took it over {} ms after its death, {} ms after its last heartbeat (ttl_ms={})",
            killed.elapsed().as_millis(),
            since.as_millis(),
            ttl.as_millis()
        );
    }
}
