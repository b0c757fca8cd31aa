//! A lease record that is gone under a running holder — LOCK removed (an operator cleaning a
//! "stale" lock, a cleanup job; with its mutex file or without), emptied, or replaced by a copy owned by another user — never
//! lets a second job start beside the first on the same host: the holder notices at once
//! (inotify on LOCK's directory) and fences its command, and a contender that finds LOCK
//! missing, empty or not the holder's own file waits for the holder's kernel mark to go, which
//! goes only after the old command is dead. Both jobs are checked by the one critical-section
//! checker (`support::cs`).

use crate::support;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Cs, Proc};

fn lh() -> Command {
    let mut c = Command::new(support::bin());
    c.stdin(Stdio::null());
    c
}

/// What happens to LOCK while its holder runs.
#[derive(Debug, Clone, Copy)]
enum Change {
    Removed,
    /// LOCK and its mutex file both removed (the holder's mark on the mutex file goes with it;
    /// its mark in LOCK's directory stays).
    RemovedWithMutex,
    Emptied,
    /// A byte copy of the live lease, owned by another user, renamed over LOCK.
    ReplacedByAnothersCopy,
}

fn change(lock: &Path, how: Change) {
    match how {
        Change::Removed => fs::remove_file(lock).expect("rm LOCK"),
        Change::RemovedWithMutex => {
            fs::remove_file(lock).expect("rm LOCK");
            let name = lock.file_name().unwrap().to_str().unwrap();
            fs::remove_file(lock.with_file_name(format!(".{name}.leasehold-mutex")))
                .expect("rm the mutex file");
        }
        Change::Emptied => {
            fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(lock)
                .expect("truncate LOCK");
        }
        Change::ReplacedByAnothersCopy => {
            let copy = lock.with_extension("copy");
            let bytes = fs::read(lock).expect("read LOCK");
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&copy)
                .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
                .expect("write the copy");
            nix::unistd::chown(&copy, Some(nix::unistd::Uid::from_raw(65534)), None)
                .expect("chown the copy to nobody");
            fs::rename(&copy, lock).expect("rename the copy over LOCK");
        }
    }
}

fn trials_of(how: Change) -> (usize, Duration) {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("job.lock");
    let cs = Cs::new(d.path(), "cs");
    let n = support::scaled(50);
    let mut fenced_after = Duration::ZERO;
    for i in 0..n {
        let (old_id, next_id) = (format!("old{i}"), format!("next{i}"));
        let mut old = Proc::spawn(
            lh().args(cs.hold_args(&["--ttl", "60s"], &lock, &old_id))
                .stderr(Stdio::piped()),
            "old run",
        );
        cs.wait_entered(&old_id, Duration::from_secs(10));
        // The old job is fenced by leasehold: the checker may let the next one replace it once
        // it is dead (never while it lives).
        cs.declare_killed(&old_id);
        let t = Instant::now();
        change(&lock, how);
        let mut next = Proc::spawn(
            lh().args(cs.run_args(&["-q", "-w", "30s", "--ttl", "5s"], &lock, &next_id, 1))
                .stderr(Stdio::piped()),
            "next run",
        );
        let st = old.wait_timeout(Duration::from_secs(30));
        fenced_after = fenced_after.max(t.elapsed());
        let err = old.stderr();
        assert_eq!(
            support::code(st),
            74,
            "{how:?}: the old run must fence its command and exit 74: {err}"
        );
        assert!(err.contains("fenced"), "{how:?}: {err}");
        let st = next.wait_timeout(Duration::from_secs(30));
        let err = next.stderr();
        assert_eq!(support::code(st), 0, "{how:?}: next run: {err}");
        assert!(cs.ended(&next_id), "{how:?}: the next job ran to its end");
    }
    let jobs = cs.verify();
    assert_eq!(jobs.len(), 2 * n, "{how:?}: every job entered: {jobs:?}");
    (n, fenced_after)
}

#[test]
fn a_lock_file_removed_emptied_or_replaced_mid_hold_never_lets_a_second_job_overlap_the_first() {
    let mut changes = vec![Change::Removed, Change::RemovedWithMutex, Change::Emptied];
    if !support::skip(
        !support::is_root(),
        "replacing LOCK by another user's copy needs root (chown)",
    ) {
        changes.push(Change::ReplacedByAnothersCopy);
    }
    for how in changes {
        let (n, slowest) = trials_of(how);
        println!(
            "{how:?}: {n} trials, 0 overlaps; the old run exited (fenced) at most {slowest:?} after the change"
        );
        // Its first renewal is due 20 s after it took the lease (TTL 60 s): a holder that
        // exits within 5 s noticed the change itself.
        assert!(
            slowest < Duration::from_secs(5),
            "{how:?}: a holder must notice at once, not at its next renewal: {slowest:?}"
        );
    }
}
