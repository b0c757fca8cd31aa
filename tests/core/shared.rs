//! Shared leases and counted slots (`LeaseBuilder::shared`, `LeaseBuilder::slots`) keep their
//! promise under SIGKILL.
//!
//! Worker processes (the `exclusion` role with `LH_MODE`) loop on one LOCK — a readers-writer
//! lock mixing shared and exclusive acquisitions, or a semaphore of 3 slots — while a killer
//! loop SIGKILLs a random worker (half the time one the lock's holders name) every few tens of
//! milliseconds and starts a replacement. The shared critical-section checker, in its shared
//! and counting mode, proves: no exclusive section ever overlapped another section, never more
//! sections together than the slot limit, holders killed inside their section and recovered
//! from without a human (every wait bounded, the lock never standing still for long), and every
//! token distinct (no token handed out twice across holder files and LOCK).

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::{CsFiles, CsReport, Proc};

/// The lock must never stand still longer than this, kills or not.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);

fn spawn(dir: &std::path::Path, n: usize, mode: &str, target: usize) -> Proc {
    let mut c = support::worker::cmd("exclusion");
    c.env("LH_DIR", dir)
        .env("LH_TTL_MS", "2000")
        .env("LH_HOLD_MS", "1")
        .env("LH_TARGET", target.to_string())
        .env("LH_MODE", mode)
        .env("LH_NAME", format!("w{n}"));
    Proc::spawn_piped(c, &format!("exclusion worker #{n}"))
}

/// The pids the lock's holders name (LOCK's own exclusive holder and every holder file's).
fn holder_pids(lock: &std::path::Path) -> Vec<i32> {
    let Ok(v) = leasehold::status(lock) else {
        return Vec::new();
    };
    let mut out: Vec<i32> = v
        .holders
        .iter()
        .filter_map(|h| h.lease.as_ref())
        .map(|l| l.holder.pid)
        .collect();
    if let Some(l) = v
        .lease
        .as_ref()
        .filter(|l| l.state == leasehold::LeaseState::Held)
    {
        out.push(l.holder.pid);
    }
    out
}

/// Runs `workers` workers in `mode` until `target` sections are logged, killing while the first
/// 80 % run; checks everything the module comment says with the checker's `limit`.
fn kill_run(mode: &str, workers: usize, target: usize, limit: usize) {
    let dir = support::tempdir();
    let files = CsFiles::new(dir.path());
    let started = Instant::now();
    let mut spawned = 0;
    let mut ws: Vec<Proc> = (0..workers)
        .map(|_| {
            spawned += 1;
            spawn(dir.path(), spawned, mode, target)
        })
        .collect();
    let mut seed = (support::now_us() as u64) | 1;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut kills, mut holder_kills) = (0usize, 0usize);
    let mut killed: HashSet<i32> = HashSet::new();
    let mut progress = support::Progress::new();
    loop {
        let done = progress.check(
            &files.log,
            RECOVERY_BOUND,
            &format!("{mode} ({kills} kills)"),
        );
        if done >= target * 4 / 5 {
            break;
        }
        support::assert_none_exited(&mut ws, &format!("{mode}: "), &files);
        std::thread::sleep(Duration::from_millis(5 + rand(30)));
        let holders = holder_pids(&files.lock);
        let by_holder: Vec<usize> = (0..ws.len())
            .filter(|i| holders.contains(&ws[*i].pid()))
            .collect();
        let victim = match by_holder.len() {
            n if n > 0 && rand(2) == 0 => {
                holder_kills += 1;
                by_holder[rand(n as u64) as usize]
            }
            _ => rand(ws.len() as u64) as usize,
        };
        let w = &mut ws[victim];
        killed.insert(w.pid());
        files.checker().declare_killed(&format!(
            "w{}",
            w.name.trim_start_matches("exclusion worker #")
        ));
        let st = w.kill();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(9),
            "worker exited before the kill: {st}"
        );
        kills += 1;
        spawned += 1;
        ws[victim] = spawn(dir.path(), spawned, mode, target);
    }
    let kill_phase = started.elapsed();
    for w in &mut ws {
        let st = w.wait_timeout(Duration::from_secs(60));
        assert!(
            st.success(),
            "{mode}: a worker failed after the kills stopped: {st}"
        );
    }
    let r = CsReport::read(&files.log);
    let (sections, most) = files.checker().verify_shared(limit);
    let killed_inside = files.checker().unfinished().len();
    let tokens: Vec<u64> = r.entries.iter().map(|e| e.0).collect();
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    eprintln!(
        "{mode}: {} acquisitions by {spawned} processes in {:.2?} (kill phase {kill_phase:.2?}), {kills} SIGKILLs ({holder_kills} at a holder), \
         {killed_inside} holders killed inside their section, {} sections checked, at most {most} inside together, \
         worst gap {:?}",
        r.entries.len(),
        started.elapsed(),
        sections.len(),
        r.worst_gap()
    );
    // Holders inside together each count the log before appending, so up to all but one of
    // them may append past the target at the end; never fewer than the target, never more.
    let together = limit.min(workers);
    assert!(
        (target..target + together).contains(&r.entries.len()),
        "{} sections logged, expected {target} to {}",
        r.entries.len(),
        target + together - 1
    );
    assert!(
        r.lost.is_empty(),
        "guards lost in a critical section: {:?}",
        r.lost
    );
    assert_eq!(distinct.len(), tokens.len(), "a token was handed out twice");
    assert!(
        killed_inside >= 1,
        "no holder was killed inside its critical section"
    );
    assert!(kills >= 20, "too few kills to mean anything: {kills}");
    assert!(
        r.entries.iter().any(|e| killed.contains(&e.1)),
        "no killed process had ever held the lock"
    );
    assert!(
        most >= 2,
        "never two holders together: the lock was not shared"
    );
    assert!(
        r.worst_gap() < RECOVERY_BOUND,
        "worst gap {:?}",
        r.worst_gap()
    );
    assert_eq!(
        leasehold::status(&files.lock).unwrap().state,
        leasehold::State::Free
    );
}

#[test]
fn shared_and_exclusive_holders_never_overlap_under_sigkill() {
    // 4 workers, 4,000 acquisitions (a quarter of them exclusive).
    kill_run("shared", 4, 4_000, usize::MAX);
}

#[test]
fn never_more_than_n_holders_of_n_slots_under_sigkill() {
    // 6 workers contending for 3 slots, 4,000 acquisitions.
    kill_run("slots 3", 6, 4_000, 3);
}
