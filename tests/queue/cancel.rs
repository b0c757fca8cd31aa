//! A waiting acquisition stopped through a `leasehold::Cancel` handle (what `run` does on
//! SIGTERM/SIGINT/SIGHUP/SIGQUIT): it returns `Error::Cancelled` at once, wherever it waits — at
//! the head of the queue (inotify and pidfds, or polling as on NFS) or behind another waiter
//! (blocked on that one's ticket) — and gives up its ticket, so those behind it move up.

use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use leasehold::{Cancel, Error, LeaseBuilder};

use crate::support::ensure_within;

/// The queue tickets of `lock` (`q-N`, not the `q-N.lease` a waiter prepares).
fn tickets(lock: &Path) -> usize {
    let name = lock.file_name().unwrap().to_string_lossy();
    std::fs::read_dir(lock.with_file_name(format!(".{name}.leasehold-queue")))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with("q-") && !n.contains('.')
                })
                .count()
        })
        .unwrap_or(0)
}

/// Starts a thread waiting for `lock` with `cancel`; its result comes on the channel.
fn waiter(lock: &Path, cancel: &Cancel, poll: bool) -> mpsc::Receiver<leasehold::Result<()>> {
    let (tx, rx) = mpsc::channel();
    let b = LeaseBuilder::new(lock)
        .ttl(Duration::from_secs(30))
        .poll(poll)
        .cancel(cancel.clone());
    thread::spawn(move || {
        let _ = tx.send(b.acquire().and_then(|g| g.release()));
    });
    rx
}

fn assert_cancelled(rx: &mpsc::Receiver<leasehold::Result<()>>, what: &str) {
    // A missed cancel would sleep until the holder's release (never, here) or a 7.5 s tick.
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Err(Error::Cancelled { .. })) => {}
        Ok(other) => panic!("{what}: not cancelled: {other:?}"),
        Err(_) => panic!("{what}: still waiting after its cancel"),
    }
}

#[test]
fn a_cancelled_waiter_returns_at_once_and_gives_up_its_ticket_wherever_it_waits() {
    for poll in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("cancel.lock");
        let held = LeaseBuilder::new(&lock)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .unwrap();
        let (head, behind) = (Cancel::new().unwrap(), Cancel::new().unwrap());
        let head_rx = waiter(&lock, &head, poll);
        ensure_within("the head's ticket", Duration::from_secs(10), || {
            tickets(&lock) == 1
        });
        let behind_rx = waiter(&lock, &behind, poll);
        ensure_within("the second ticket", Duration::from_secs(10), || {
            tickets(&lock) == 2
        });
        behind.cancel();
        assert_cancelled(&behind_rx, &format!("poll={poll}: the waiter behind"));
        assert_eq!(
            tickets(&lock),
            1,
            "poll={poll}: the cancelled ticket stayed"
        );
        head.cancel();
        assert_cancelled(&head_rx, &format!("poll={poll}: the head"));
        assert_eq!(tickets(&lock), 0, "poll={poll}: the head's ticket stayed");
        assert!(!held.is_lost(), "poll={poll}: the holder lost its lease");
        held.release().unwrap();
        // A cancelled handle stays cancelled: a blocking acquisition with it takes nothing,
        // even of a free lock.
        let again = LeaseBuilder::new(&lock).cancel(head.clone()).acquire();
        assert!(matches!(again, Err(Error::Cancelled { .. })), "{again:?}");
    }
}
