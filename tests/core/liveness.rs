//! Liveness verdicts with real processes.
//!
//! - PID reuse: a lease naming a live PID with another start time is stale at once; with the
//!   right start time it is held.
//! - A lease from another host, boot or pid namespace is never judged by local process checks:
//!   naming a dead PID it stays held, naming a live one it still goes stale, in both cases only
//!   once this host has seen its heartbeat unchanged for a TTL.
//! - Clock skew: a holder whose wall clock is 10 minutes ahead or behind is never broken while it
//!   renews, and is taken over about a TTL after it stops (SIGSTOP, SIGKILL).
//! - One-shot callers: fresh processes calling `try_acquire` once each, every TTL/4, take over a
//!   dead foreign holder once this host has seen no heartbeat for a TTL across those calls.
//! - A waiter wakes when the holder's lease turns stale by the *holder's* TTL, not at its own
//!   tick: a waiter with a long TTL takes over a silent foreign holder with a short one soon after
//!   that holder's TTL.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::support::Proc;
use leasehold::{Identity, LeaseBuilder, SkewedClock, State};
use nix::sys::signal::Signal;

#[test]
fn live_pid_with_another_start_time_is_stale() {
    let dir = support::tempdir();
    let lock = dir.path().join("reuse.lock");
    let me = Identity::current();
    let mut sleeper = Proc::spawn(
        {
            let mut c = std::process::Command::new("sleep");
            c.arg("60");
            c
        },
        "sleep",
    );
    let pid = sleeper.pid();
    let (_, start) = support::stat(pid).expect("sleep's /proc entry");
    let ttl = Duration::from_secs(60);

    // Control: the right start time makes the same lease held.
    let right = support::crafted(pid, start, &me, ttl, 41);
    support::write_atomic(&lock, &right.to_bytes());
    let v = leasehold::status(&lock).unwrap();
    assert_eq!(v.state, State::Held, "{v}");
    assert!(v.same_host);
    let e = LeaseBuilder::new(&lock).try_acquire().unwrap_err();
    assert!(matches!(e, leasehold::Error::WouldBlock { .. }), "{e}");

    // The same live PID with another start time: a reused PID, stale at once.
    let reused = support::crafted(pid, start + 4242, &me, ttl, 42);
    support::write_atomic(&lock, &reused.to_bytes());
    let v = leasehold::status(&lock).unwrap();
    eprintln!(
        "pid reuse: live pid {pid} recorded with start {}: {v}",
        start + 4242
    );
    assert_eq!(v.state, State::Stale, "{v}");
    assert!(
        v.reason.contains("reused"),
        "reason should say why: {}",
        v.reason
    );
    let t0 = Instant::now();
    let g = LeaseBuilder::new(&lock)
        .try_acquire()
        .expect("take over a reused-PID lease");
    assert!(g.token() > 42, "token {} after 42", g.token());
    assert_eq!(g.broke().map(|v| v.state), Some(State::Stale));
    eprintln!(
        "pid reuse: taken over at once ({:?}), token {}",
        t0.elapsed(),
        g.token()
    );
    g.release().unwrap();
    // The sleeper was never signalled: a reused PID belongs to someone else.
    assert!(
        sleeper.try_wait().is_none() && support::running(sleeper.pid()),
        "the innocent process was touched"
    );
    sleeper.kill();
}

#[test]
fn foreign_holders_are_judged_only_by_their_heartbeat() {
    let dir = support::tempdir();
    let me = Identity::current();
    let ttl = Duration::from_millis(800);
    let dead = support::dead_pid();
    let own = std::process::id() as i32;
    let (_, own_start) = support::stat(own).unwrap();
    let mut other_host = me.clone();
    other_host.host = "elsewhere".into();
    let mut other_boot = me.clone();
    other_boot.boot_id = "00000000-0000-0000-0000-000000000000".into();
    let mut other_ns = me.clone();
    other_ns.pid_ns = me.pid_ns + 1;
    let cases = [
        ("other host, dead pid", other_host.clone(), dead, 0),
        ("other boot, dead pid", other_boot, dead, 0),
        ("other pid namespace, dead pid", other_ns, dead, 0),
        ("other host, live local pid", other_host, own, own_start),
    ];
    // Control: the same dead PID on this very host is stale at once.
    let control = dir.path().join("control.lock");
    support::write_atomic(&control, &support::crafted(dead, 1, &me, ttl, 7).to_bytes());
    let v = leasehold::status(&control).unwrap();
    assert_eq!(v.state, State::Stale, "same-host dead pid: {v}");

    let mut pending = Vec::new();
    for (i, (name, who, pid, start)) in cases.into_iter().enumerate() {
        let lock = dir.path().join(format!("foreign{i}.lock"));
        support::write_atomic(
            &lock,
            &support::crafted(pid, start, &who, ttl, 100).to_bytes(),
        );
        // Taken before the first look, which is when this host first sees the heartbeat: the
        // time measured from here is never shorter than the judge's (taking it after the
        // look and the refused try_acquire made a busy machine report "stale early").
        let first = Instant::now();
        let v = leasehold::status(&lock).unwrap();
        assert_eq!(
            v.state,
            State::Held,
            "{name}: first look must say held: {v}"
        );
        assert!(!v.same_host, "{name}");
        let e = LeaseBuilder::new(&lock).try_acquire().unwrap_err();
        assert!(
            matches!(e, leasehold::Error::WouldBlock { .. }),
            "{name}: {e}"
        );
        pending.push((name, lock, first));
    }
    let end = Instant::now() + ttl * 4;
    while !pending.is_empty() {
        assert!(
            Instant::now() < end,
            "never went stale: {:?}",
            pending.iter().map(|p| p.0).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
        let mut still = Vec::new();
        for (name, lock, first) in pending {
            let v = leasehold::status(&lock).unwrap();
            match v.state {
                State::Held => still.push((name, lock, first)),
                State::Stale => {
                    let after = first.elapsed();
                    eprintln!(
                        "foreign ({name}): stale {after:?} after first seen (TTL {ttl:?}): {}",
                        v.reason
                    );
                    assert!(
                        after + Duration::from_millis(2) >= ttl,
                        "{name}: stale early, after {after:?}"
                    );
                    assert!(
                        after <= ttl + Duration::from_millis(500),
                        "{name}: stale late, after {after:?}"
                    );
                    let g = LeaseBuilder::new(&lock)
                        .try_acquire()
                        .expect("take the stale lease");
                    assert!(g.token() > 100);
                    g.release().unwrap();
                }
                other => panic!("{name}: {other}: {v}"),
            }
        }
        pending = still;
    }
}

/// Holds a foreign lease with a skewed clock in a child, checks contenders (skewed the other
/// way) never break it while it renews, stops it with `stop`, and returns the takeover time.
fn skew_case(lock: &std::path::Path, skew_s: i64, stop: Signal) -> Duration {
    let ttl = Duration::from_millis(1000);
    let (mut holder, token, _) = support::spawn_holder(
        lock,
        ttl,
        &[
            ("LH_HOST", format!("skewed{skew_s}")),
            ("LH_SKEW_S", skew_s.to_string()),
        ],
    );
    // The injected skew shows in what the holder writes.
    let at = support::raw_lease(lock).unwrap()["heartbeat_at"]
        .as_str()
        .unwrap()
        .to_string();
    let at = leasehold::parse_rfc3339(&at).unwrap();
    let off = match at.duration_since(SystemTime::now()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    assert!(
        (off - skew_s as f64).abs() < 30.0,
        "holder's clock is off by {off:.0}s, wanted {skew_s}s"
    );
    let contender_clock = if skew_s > 0 {
        SkewedClock::behind(Duration::from_secs(600))
    } else {
        SkewedClock::ahead(Duration::from_secs(600))
    };
    let contender = || {
        LeaseBuilder::new(lock)
            .ttl(ttl)
            .clock(Arc::new(contender_clock))
    };
    // While it renews: 3 TTLs of attempts, all refused.
    let watch = Instant::now();
    let mut refused = 0;
    let seq0 = support::raw_lease(lock).unwrap()["heartbeat_seq"]
        .as_u64()
        .unwrap();
    while watch.elapsed() < ttl * 3 {
        match contender().try_acquire() {
            Err(leasehold::Error::WouldBlock { verdict, .. }) => {
                assert_eq!(verdict.state, State::Held, "{verdict}");
                refused += 1;
            }
            Ok(g) => panic!(
                "skew {skew_s}s: broke a renewing holder after {:?}: {:?}",
                watch.elapsed(),
                g.broke()
            ),
            Err(e) => panic!("{e}"),
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let seq1 = support::raw_lease(lock).unwrap()["heartbeat_seq"]
        .as_u64()
        .unwrap();
    assert!(seq1 > seq0, "the holder did not renew");
    holder.signal(stop);
    let stopped = Instant::now();
    let g = contender()
        .acquire_timeout(ttl * 5)
        .unwrap_or_else(|e| panic!("skew {skew_s}s: eternal lock: {e}"));
    let took = stopped.elapsed();
    assert!(g.token() > token);
    eprintln!(
        "clock skew {skew_s:+}s: {refused} attempts refused over 3 TTLs while renewing (seq {seq0}->{seq1}); \
         after {stop} taken over in {took:?} (TTL {ttl:?}): {}",
        g.broke().map(|v| v.reason.clone()).unwrap_or_default()
    );
    if stop == Signal::SIGSTOP {
        // Woken up, the old holder must find itself lost (fenced), not carry on.
        holder.signal(Signal::SIGCONT);
        let lost = holder.line("LOST", Duration::from_secs(5));
        eprintln!("clock skew {skew_s:+}s: resumed holder reports: lost: {lost}");
    }
    g.release().unwrap();
    holder.kill();
    took
}

#[test]
fn skewed_holder_clock_neither_breaks_early_nor_locks_forever() {
    let dir = support::tempdir();
    let ahead = dir.path().join("ahead.lock");
    let behind = dir.path().join("behind.lock");
    let a = std::thread::spawn(move || skew_case(&ahead, 600, Signal::SIGSTOP));
    let b = std::thread::spawn(move || skew_case(&behind, -600, Signal::SIGKILL));
    let ttl = Duration::from_millis(1000);
    for took in [a.join().unwrap(), b.join().unwrap()] {
        // Silence is counted from the last heartbeat seen, at most one heartbeat (TTL/3) before
        // the stop; allow scheduling slack above.
        assert!(
            took >= ttl - ttl / 3 - Duration::from_millis(20),
            "taken over early: {took:?}"
        );
        assert!(
            took <= ttl + Duration::from_millis(700),
            "taken over late: {took:?}"
        );
    }
}

#[test]
fn dead_foreign_holder_is_taken_over_by_one_shot_callers() {
    let dir = support::tempdir();
    let lock = dir.path().join("cron.lock");
    let ttl = Duration::from_millis(1000);
    let every = ttl / 4;
    let oneshot = || {
        let mut c = support::worker::cmd("oneshot");
        c.env("LH_LOCK", &lock)
            .env("LH_TTL_MS", ttl.as_millis().to_string());
        let mut p = Proc::spawn_piped(c, "one-shot caller");
        let out = p.line("OUTCOME", Duration::from_secs(10));
        assert!(p.wait_timeout(Duration::from_secs(10)).success());
        out
    };
    let (mut holder, token, _) =
        support::spawn_holder(&lock, ttl, &[("LH_HOST", "otherhost".into())]);
    let out = oneshot();
    assert!(out.starts_with("wouldblock"), "live foreign holder: {out}");
    holder.kill();
    let killed = Instant::now();
    let mut outcomes = Vec::new();
    let taken_at = loop {
        let call = Instant::now();
        let out = oneshot();
        let at = killed.elapsed();
        outcomes.push(format!(
            "{at:.0?}: {}",
            out.split(':').next().unwrap_or(&out)
        ));
        if let Some(t) = out.strip_prefix("acquired ") {
            assert!(t.parse::<u64>().unwrap() > token);
            break at;
        }
        assert!(out.starts_with("wouldblock"), "{out}");
        assert!(outcomes.len() < 20, "never taken over: {outcomes:#?}");
        std::thread::sleep(every.saturating_sub(call.elapsed()));
    };
    eprintln!(
        "one-shot takeover of a dead foreign holder (TTL {ttl:?}, a call every {every:?}): {outcomes:#?}"
    );
    let refused = outcomes.len() - 1;
    assert!(
        refused >= 2,
        "the first calls after the death must be refused: {outcomes:#?}"
    );
    assert!(
        taken_at >= ttl - ttl / 3 - Duration::from_millis(20),
        "early: {taken_at:?}"
    );
    assert!(
        taken_at <= ttl + every * 2 + Duration::from_millis(500),
        "late: {taken_at:?}"
    );
}

/// A blocking waiter with the default 30 s TTL (its own tick: TTL/4 capped at 5 s) takes over a
/// silent foreign holder whose lease has a 400 ms TTL soon after those 400 ms — it wakes at the
/// holder's deadline on its own clock — not at its own next tick. The bound is derived from the
/// holder's settings (its TTL plus a second of slack for a loaded machine), far below the
/// waiter's 5 s tick, which is where the take-over landed when the waiter slept its own tick.
#[test]
fn a_long_ttl_waiter_takes_over_a_short_ttl_foreign_holder_at_the_holders_deadline() {
    let dir = support::tempdir();
    let lock = dir.path().join("short.lock");
    let mut elsewhere = Identity::current();
    elsewhere.host = "elsewhere".into();
    let holder_ttl = Duration::from_millis(400);
    support::write_atomic(
        &lock,
        &support::crafted(support::dead_pid(), 0, &elsewhere, holder_ttl, 100).to_bytes(),
    );
    let waiter = LeaseBuilder::new(&lock).ttl(Duration::from_secs(30));
    let waiter_tick = Duration::from_secs(5);
    let t0 = Instant::now();
    let g = waiter
        .acquire_timeout(Duration::from_secs(20))
        .expect("the silent foreign holder is taken over");
    let took = t0.elapsed();
    eprintln!("deadline wake: taken {took:?} after the first look (holder TTL {holder_ttl:?})");
    assert!(
        took + Duration::from_millis(2) >= holder_ttl,
        "taken early: {took:?}"
    );
    let bound = holder_ttl + Duration::from_secs(1);
    assert!(bound < waiter_tick);
    assert!(
        took <= bound,
        "taken {took:?} after the first look: the waiter slept past the holder's deadline \
         ({holder_ttl:?}); bound {bound:?}"
    );
    assert!(g.token() > 100);
    g.release().unwrap();
}
