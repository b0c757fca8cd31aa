//! Mutual exclusion between real processes.
//!
//! Four processes (this test binary re-run as `exclusion` workers) take the lease on one LOCK in
//! a loop until 2,000 critical sections have run, each checked by the shared critical-section
//! checker (O_EXCL `inside`, intervals that must not intersect) and logging `token pid`.
//! Proves: no overlap, and fencing tokens strictly increasing in critical-section (log) order.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{CsFiles, CsReport, Proc};

const WORKERS: usize = 4;
const TARGET: usize = 2_000;

#[test]
fn four_processes_never_overlap_and_tokens_increase() {
    let dir = support::tempdir();
    let files = CsFiles::new(dir.path());
    let started = Instant::now();
    let mut workers: Vec<Proc> = (0..WORKERS)
        .map(|i| {
            let mut c = support::worker::cmd("exclusion");
            c.env("LH_DIR", dir.path())
                .env("LH_TTL_MS", "2000")
                .env("LH_TARGET", TARGET.to_string())
                .env("LH_NAME", format!("w{i}"));
            Proc::spawn_piped(c, &format!("exclusion worker {i}"))
        })
        .collect();
    let pids: Vec<i32> = workers.iter().map(Proc::pid).collect();
    for w in &mut workers {
        let st = w.wait_timeout(Duration::from_secs(120));
        assert!(st.success(), "a worker failed: {st}");
    }
    let took = started.elapsed();
    let r = CsReport::read(&files.log);
    let sections = files.checker().verify();
    let mut per_worker = vec![0usize; WORKERS];
    for (_, pid, _) in &r.entries {
        if let Some(i) = pids.iter().position(|p| p == pid) {
            per_worker[i] += 1;
        }
    }
    eprintln!(
        "exclusion: {} acquisitions by {WORKERS} processes in {took:.2?} ({:.0}/s), per worker {per_worker:?}, \
         checked sections {}, token regressions {}, lost guards {}, worst gap {:?}, tokens {}..={}",
        r.entries.len(),
        r.entries.len() as f64 / took.as_secs_f64(),
        sections.len(),
        r.token_regressions().len(),
        r.lost.len(),
        r.worst_gap(),
        r.entries.first().map_or(0, |e| e.0),
        r.entries.last().map_or(0, |e| e.0),
    );
    assert!(
        sections.len() >= TARGET,
        "the checker saw only {} critical sections",
        sections.len()
    );
    r.assert_sound(TARGET);
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() >= 2,
        "the lock never changed hands between processes: {per_worker:?}"
    );
    files.assert_idle();
}
