//! Issue 5, frozen holders and waiters: SIGSTOP a holder or a waiter at a random point for a
//! random time (shorter or longer than the TTL), then SIGCONT it. Never two live holders in the
//! critical section (overlap detector: each section registers pid + start time under its token;
//! entering while a registered one is still alive is a violation), every process ends (done,
//! fenced with 74, or SIGKILLed as hung), LOCK parses, and the lock recovers within TTL + 1 s.
//! Library holders always; `leasehold run` holders (the wrapper frozen, its command running on)
//! once the CLI exists.

#[path = "faults/common.rs"]
mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Kid, Mode, Rng};
use nix::sys::signal::Signal;

const TTL: Duration = Duration::from_millis(200);

#[test]
fn helper() {
    common::helper_main();
}

fn spawn(mode: Mode, lock: &Path, work: &Path, name: &str, hold_ms: u64) -> Kid {
    let wait = Duration::from_secs(8);
    let mut c = common::contender(mode, lock, TTL, wait, hold_ms, &work.join("cs"));
    Kid::spawn(&mut c, name)
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
    fs::create_dir_all(work.join("cs")).unwrap();
    let lock = lockdir.join("job.lock");
    let (mut long_stops, mut fenced, mut killed_hung, mut worst) = (0, 0, 0, Duration::ZERO);
    let mut problems = Vec::new();
    for trial in 0..n {
        let mut h = spawn(mode, &lock, &work, "holder", 50 + rng.below(150));
        let mut w = spawn(mode, &lock, &work, "waiter", rng.below(30));
        std::thread::sleep(Duration::from_micros(rng.below(60_000)));
        let stop_for = Duration::from_millis(rng.below(450));
        if stop_for > TTL {
            long_stops += 1;
        }
        let victim = if rng.chance(70) { &h } else { &w };
        victim.signal(Signal::SIGSTOP);
        std::thread::sleep(stop_for);
        victim.signal(Signal::SIGCONT);
        for k in [&mut h, &mut w] {
            let c = common::code(k.wait_timeout(Duration::from_secs(20)));
            match c {
                0 => {}
                74 => fenced += 1,
                137 => killed_hung += 1,
                _ => {
                    let mut err = String::new();
                    if let Some(mut e) = k.child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    problems.push(format!(
                        "trial {trial}: {} exited {c}: {}",
                        k.what,
                        err.trim()
                    ));
                }
            }
        }
        common::assert_lock_parses(&lock);
        let stray = common::stray_files(&lockdir, "job.lock");
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
    let v = common::violations(&work);
    println!(
        "faults: frozen holders/waiters ({mode:?}): trials={n} violations={} stops_longer_than_ttl={long_stops} fenced_74={fenced} sigkilled_as_hung={killed_hung} worst_recovery_ms={} ttl_ms={}",
        v.len(),
        worst.as_millis(),
        TTL.as_millis()
    );
    assert!(v.is_empty(), "overlaps:\n{}", v.join("\n"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn frozen_library_holders_and_waiters() {
    trials(Mode::Library, common::scaled(60));
}

#[test]
fn frozen_cli_holders_and_waiters() {
    if common::need_cli() {
        return;
    }
    trials(Mode::Cli, common::scaled(60));
}
