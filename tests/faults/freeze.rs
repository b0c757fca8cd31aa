//! Frozen holders and waiters: SIGSTOP a holder or a waiter at a random point for a random time
//! (shorter or longer than the TTL), then SIGCONT it. Never two holders running in the critical
//! section (the shared checker, `support::cs`: a newcomer may replace only an occupant that is
//! dead or stopped — leasehold stops a hung holder's command before a takeover — and no two
//! sections' intervals may intersect, so an occupant that ran on after being replaced fails),
//! every process ends (done, or — only after a freeze long enough for it — fenced with 74 or
//! SIGKILLed as hung), LOCK parses, nothing
//! undocumented is left beside it or in its queue, and the lock recovers within TTL + 1 s. Both
//! library holders and `leasehold run` holders (the wrapper frozen, its command running on).

use crate::support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{Cs, Mode, Proc, Rng};
use nix::sys::signal::Signal;

const TTL: Duration = Duration::from_millis(200);
const TTL_MS: u64 = TTL.as_millis() as u64;
/// The contenders' heartbeat in ms (`support::contender`).
const HEARTBEAT_MS: u64 = 20;
/// A slack for the test's own timing (its sleep and signals are not exact), in ms.
const SLACK_MS: u64 = 10;
/// The shortest freeze that can get a holder fenced (exit 74): its renew deadline is its last
/// renewal + TTL − grace (TTL/4) − margin (max(20 ms, TTL/20)), and it renewed at most a
/// heartbeat before the stop.
const MIN_FREEZE_FENCED: Duration =
    Duration::from_millis(TTL_MS - TTL_MS / 4 - 20 - HEARTBEAT_MS - SLACK_MS);
/// The shortest freeze that can get a process killed as hung (exit 137): its heartbeat must
/// be seen unchanged for a TTL, and it beat at most a heartbeat before the stop.
const MIN_FREEZE_KILLED: Duration = Duration::from_millis(TTL_MS - HEARTBEAT_MS - SLACK_MS);

fn spawn(mode: Mode, lock: &Path, work: &Path, id: &str, hold_ms: u64) -> Proc {
    let wait = Duration::from_secs(8);
    let name = id.split('-').next_back().unwrap_or(id);
    let mut c = support::contender(mode, id, lock, TTL, wait, hold_ms, &work.join("cs"));
    Proc::spawn(&mut c, name)
}

fn trials(mode: Mode, n: usize) {
    let mut rng = Rng::new(&format!("freeze ({mode:?})"));
    let base = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .unwrap();
    let lockdir = base.path().join("locks");
    let work = base.path().join("work");
    fs::create_dir_all(&lockdir).unwrap();
    fs::create_dir_all(&work).unwrap();
    let cs = Cs::new(&work, "cs");
    cs.allow_fenced();
    let lock = lockdir.join("job.lock");
    let (mut long_stops, mut fenced, mut killed_hung, mut worst) = (0, 0, 0, Duration::ZERO);
    let mut problems = Vec::new();
    for trial in 0..n {
        let mut h = spawn(
            mode,
            &lock,
            &work,
            &format!("t{trial}-holder"),
            50 + rng.below(150),
        );
        let mut w = spawn(
            mode,
            &lock,
            &work,
            &format!("t{trial}-waiter"),
            rng.below(30),
        );
        std::thread::sleep(Duration::from_micros(rng.below(60_000)));
        let stop_for = Duration::from_millis(rng.below(450));
        if stop_for > TTL {
            long_stops += 1;
        }
        let holder_frozen = rng.chance(70);
        let victim = if holder_frozen { &h } else { &w };
        victim.signal(Signal::SIGSTOP);
        std::thread::sleep(stop_for);
        victim.signal(Signal::SIGCONT);
        for (k, frozen) in [(&mut h, holder_frozen), (&mut w, !holder_frozen)] {
            let c = support::code(k.wait_timeout(Duration::from_secs(20)));
            // Fenced or killed as hung only if frozen long enough for it: `froze` is how long
            // this process was stopped (zero if it was not the one).
            let froze = if frozen { stop_for } else { Duration::ZERO };
            match c {
                0 => {}
                74 if froze >= MIN_FREEZE_FENCED => fenced += 1,
                137 if froze >= MIN_FREEZE_KILLED => killed_hung += 1,
                74 | 137 => problems.push(format!(
                    "trial {trial}: {} exited {c} after a freeze of {froze:?} (fenced needs at \
                     least {MIN_FREEZE_FENCED:?}, killed as hung {MIN_FREEZE_KILLED:?}): {}",
                    k.name,
                    k.stderr().trim()
                )),
                _ => {
                    let err = k.stderr();
                    problems.push(format!(
                        "trial {trial}: {} exited {c}: {}",
                        k.name,
                        err.trim()
                    ));
                }
            }
        }
        support::assert_lock_parses(&lock);
        let stray = support::stray_files(&lockdir, "job.lock");
        assert!(stray.is_empty(), "trial {trial}: stray files: {stray:?}");
        let t0 = Instant::now();
        let g = leasehold::LeaseBuilder::new(&lock)
            .ttl(TTL)
            .durable(false)
            .acquire_timeout(TTL + Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("trial {trial}: lock did not recover: {e}"));
        worst = worst.max(t0.elapsed());
        g.release().unwrap();
    }
    let v = cs.violations();
    let sections = cs.intervals();
    let overlaps = support::cs::overlaps(&sections);
    println!(
        "faults: frozen holders/waiters ({mode:?}): trials={n} violations={} stops_longer_than_ttl={long_stops} fenced_74={fenced} sigkilled_as_hung={killed_hung} worst_recovery_ms={} ttl_ms={}",
        v.len(),
        worst.as_millis(),
        TTL.as_millis()
    );
    assert!(v.is_empty(), "overlaps:\n{}", v.join("\n"));
    assert!(overlaps.is_empty(), "overlaps:\n{}", overlaps.join("\n"));
    assert!(
        sections.len() >= n,
        "only {} critical sections in {n} trials",
        sections.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn frozen_library_holders_and_waiters() {
    trials(Mode::Library, support::scaled(60));
}

#[test]
fn frozen_cli_holders_and_waiters() {
    trials(Mode::Cli, support::scaled(60));
}
