//! Mutual exclusion survives holders being SIGKILLed.
//!
//! Four worker processes loop on one LOCK as in `core_exclusion.rs` while a killer loop SIGKILLs
//! a random worker — half the time the one the lease names as holder — every few tens of
//! milliseconds, reaps it and starts a replacement. Proves: no overlap (the shared checker's
//! `inside` left by a holder killed inside its critical section is only ever replaced once its
//! owner was declared killed and is dead), holders killed inside their critical section,
//! tokens strictly increasing in critical-section order, and that the lock always recovers
//! without a human: every worker's wait is bounded (20 s, else it fails), the worst gap between
//! two critical sections is reported and bounded, and all 2,000 acquisitions complete.

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::{CsFiles, CsReport, Proc};

const WORKERS: usize = 4;
const TARGET: usize = 2_000;
/// The lock must never stand still longer than this, kills or not.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);

/// The checker name of a worker (its `LH_NAME`).
fn w_name(w: &Proc) -> String {
    format!("w{}", w.name.trim_start_matches("exclusion worker #"))
}

fn spawn(dir: &std::path::Path, n: usize) -> Proc {
    let mut c = support::worker::cmd("exclusion");
    c.env("LH_DIR", dir)
        .env("LH_TTL_MS", "2000")
        .env("LH_HOLD_MS", "1")
        .env("LH_TARGET", TARGET.to_string())
        .env("LH_NAME", format!("w{n}"));
    Proc::spawn_piped(c, &format!("exclusion worker #{n}"))
}

#[test]
fn sigkilled_holders_never_cause_overlap_and_lock_recovers() {
    let dir = support::tempdir();
    let files = CsFiles::new(dir.path());
    let started = Instant::now();
    let mut spawned = 0;
    let mut workers: Vec<Proc> = (0..WORKERS)
        .map(|_| {
            spawned += 1;
            spawn(dir.path(), spawned)
        })
        .collect();
    let mut seed = (support::now_us() as u64) | 1;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut kills = 0usize;
    let mut holder_kills = 0usize;
    let mut killed: HashSet<i32> = HashSet::new();
    let mut progress = support::Progress::new();
    // Kill while the first 80 % of the acquisitions run; the rest must finish unassisted.
    loop {
        let done = progress.check(&files.log, RECOVERY_BOUND, &format!("{kills} kills"));
        if done >= TARGET * 4 / 5 {
            break;
        }
        support::assert_none_exited(&mut workers, "", &files);
        std::thread::sleep(Duration::from_millis(5 + rand(30)));
        let holder = support::raw_lease(&files.lock)
            .filter(|v| v["state"] == "held")
            .and_then(|v| v["holder"]["pid"].as_i64())
            .map(|p| p as i32);
        let by_holder = workers.iter().position(|w| Some(w.pid()) == holder);
        let victim = match by_holder {
            Some(i) if rand(2) == 0 => {
                holder_kills += 1;
                i
            }
            _ => rand(WORKERS as u64) as usize,
        };
        let w = &mut workers[victim];
        killed.insert(w.pid());
        files.checker().declare_killed(&w_name(w));
        let st = w.kill(); // SIGKILL, then reap
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(9),
            "worker exited before the kill: {st}"
        );
        kills += 1;
        spawned += 1;
        workers[victim] = spawn(dir.path(), spawned);
    }
    let kill_phase = started.elapsed();
    for w in &mut workers {
        let st = w.wait_timeout(Duration::from_secs(60));
        assert!(
            st.success(),
            "a worker failed after the kills stopped: {st}"
        );
    }
    let took = started.elapsed();
    let r = CsReport::read(&files.log);
    let sections = files.checker().verify();
    let killed_inside = files.checker().unfinished().len();
    let regressions = r.token_regressions();
    eprintln!(
        "exclusion under SIGKILL: {} acquisitions in {took:.2?} (kill phase {kill_phase:.2?}), {kills} SIGKILLs \
         ({holder_kills} aimed at the lease's holder), {spawned} processes in all, {} holders killed inside \
         their critical section and recovered from, checked sections {}, token regressions {}, lost guards {}, \
         worst gap between critical sections {:?}, longest stall seen by the killer {:?}",
        r.entries.len(),
        killed_inside,
        sections.len(),
        regressions.len(),
        r.lost.len(),
        r.worst_gap(),
        progress.stalled_max,
    );
    assert!(
        killed_inside >= 1,
        "no holder was killed inside its critical section: the kills proved nothing"
    );
    r.assert_sound(TARGET);
    assert!(kills >= 20, "too few kills to mean anything: {kills}");
    assert!(
        r.entries.iter().any(|e| killed.contains(&e.1)),
        "no killed process had ever held the lock"
    );
    assert!(
        r.worst_gap() < RECOVERY_BOUND,
        "worst gap {:?}",
        r.worst_gap()
    );
    files.assert_idle();
}
