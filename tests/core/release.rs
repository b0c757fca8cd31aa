//! Releasing: with nobody waiting, the released record
//! says how the job ended; with a waiter queued, the lease is released in place (its file's
//! released bit) and the waiter takes it; a release never writes into (or marks) a LOCK whose
//! bytes are no longer our lease, even when it was rewritten in place (same inode); and the
//! released bit alone releases a record for every reader.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{LeaseBuilder, LeaseState, State};

/// Waits (polling `status`, never sleeping blind past 10 s) until `n` waiters are queued.
fn wait_queued(lock: &Path, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = leasehold::status(lock).unwrap();
        if v.queue.len() >= n {
            return;
        }
        assert!(Instant::now() < end, "no waiter queued: {v}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn released_record_or_handover_in_place() {
    let dir = support::tempdir();
    let lock = dir.path().join("job.lock");
    let first = LeaseBuilder::new(&lock)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let first_token = first.token();

    let waiter = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            LeaseBuilder::new(&lock)
                .ttl(Duration::from_secs(30))
                .acquire_timeout(Duration::from_secs(20))
        })
    };
    wait_queued(&lock, 1);
    first.release_with("first done").unwrap();
    let second = waiter
        .join()
        .unwrap()
        .expect("the queued waiter takes the lease");
    assert!(second.token() > first_token);
    let v = leasehold::status(&lock).unwrap();
    assert_eq!(v.state, State::Held, "{v}");
    assert_eq!(v.lease.as_ref().unwrap().lease_id, second.lease_id());
    assert!(v.queue.is_empty(), "the taker left the queue: {v}");

    // Nobody waits now: the full released record, with how the job ended.
    second.release_with("second done").unwrap();
    let v = leasehold::status(&lock).unwrap();
    assert_eq!(v.state, State::Free, "{v}");
    let l = v.lease.unwrap();
    assert_eq!(l.state, LeaseState::Released);
    assert_eq!(l.ended.expect("how it ended").how, "second done");
}

#[test]
fn release_never_writes_into_a_lock_rewritten_in_place() {
    let dir = support::tempdir();
    for waiting in [false, true] {
        let lock = dir.path().join(format!("rewritten-{waiting}.lock"));
        let g = LeaseBuilder::new(&lock)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .unwrap();
        let waiter = waiting.then(|| {
            let lock = lock.clone();
            std::thread::spawn(move || {
                LeaseBuilder::new(&lock)
                    .ttl(Duration::from_secs(30))
                    .acquire_timeout(Duration::from_secs(20))
            })
        });
        if waiting {
            wait_queued(&lock, 1);
        }
        // Same inode, other bytes, as `echo ... > LOCK` leaves it — but written over the lease
        // and then cut, never truncated first: an empty LOCK is free by definition, and a
        // waiter woken between the truncation and the write would rightly take it.
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
            let text = b"somebody else's file\n";
            f.write_all_at(text, 0).unwrap();
            f.set_len(text.len() as u64).unwrap();
        }
        let r = g.release();
        assert_eq!(
            std::fs::read(&lock).unwrap(),
            b"somebody else's file\n",
            "release wrote into a file that is not our lease (waiter queued: {waiting}); it returned {r:?}"
        );
        if let Some(w) = waiter {
            // The waiter refuses a LOCK that is not a lease rather than take it over.
            let e = w
                .join()
                .unwrap()
                .expect_err("a waiter must not take over a foreign file");
            eprintln!("waiter: {e}");
        }
        eprintln!("release (waiter queued: {waiting}): {r:?}");
    }
}

/// The released bit (`chmod +t`, what a holder sets to release in place) makes a record
/// released for every reader, whatever its JSON says, and the holder (were it still running)
/// finds its lease released at once and is lost. Set by someone else while the holder still
/// runs, the lock is not free yet: its holder's kernel mark says it still runs, so `status`
/// calls it held and a contender waits; once the holder is gone, a waiter takes it.
#[test]
fn the_released_bit_releases_a_record_and_its_holder_sees_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = support::tempdir();
    let lock = dir.path().join("bit.lock");
    let ttl = Duration::from_secs(10);
    let (mut holder, token, lease_id) =
        support::spawn_holder(&lock, ttl, &[("LH_HB_MS", "50".into())]);
    assert_eq!(leasehold::status(&lock).unwrap().state, State::Held);
    let raw = std::fs::read(&lock).unwrap();
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o1644)).unwrap();
    let lost = holder.line("LOST", Duration::from_secs(5));
    assert!(lost.contains("released"), "{lost}");
    let v = leasehold::status(&lock).unwrap();
    assert_eq!(v.state, State::Held, "{v}");
    assert!(v.reason.contains("still running"), "{v}");
    let l = v.lease.as_ref().unwrap();
    assert_eq!(
        (l.state, l.lease_id.as_str()),
        (LeaseState::Released, lease_id.as_str())
    );
    assert!(
        LeaseBuilder::new(&lock).ttl(ttl).try_acquire().is_err(),
        "taken while its holder still runs"
    );
    // Its bytes were never touched: the bit alone says it.
    assert_eq!(std::fs::read(&lock).unwrap(), raw);
    holder.close_stdin();
    holder.wait_timeout(Duration::from_secs(10));
    assert_eq!(leasehold::status(&lock).unwrap().state, State::Free);
    let g = LeaseBuilder::new(&lock).ttl(ttl).try_acquire().unwrap();
    assert!(g.token() > token);
    g.release().unwrap();
}

/// The files a holding lets go of (the record its lease replaced, claimed for the holding; its
/// own lease file once a released record replaced it) are closed, now or later (`grave.rs`): a
/// program that takes and releases a lease many times keeps a handful of descriptors of the
/// lock's directory open, not one more per round (a replaced file never closed: 100 more).
#[test]
fn a_long_loop_of_acquisitions_does_not_keep_old_files_open() {
    let dir = support::tempdir();
    let lock = dir.path().join("loop.lock");
    let b = LeaseBuilder::new(&lock).ttl(Duration::from_secs(30));
    // Descriptors of this process that lead into the lock's directory (a deleted file keeps
    // its path, with " (deleted)"): other tests of this binary use other directories.
    let open_here = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.starts_with(dir.path()))
            .count()
    };
    for _ in 0..100 {
        b.try_acquire().unwrap().release().unwrap();
    }
    let g = b.try_acquire().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut n = open_here();
    while n > 12 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
        n = open_here();
    }
    assert!(
        n <= 12,
        "{n} descriptors into the lock's directory after 100 rounds"
    );
    g.release().unwrap();
}
