//! Breaking a lease by hand (`break`): a stale lease is broken without confirmation; a
//! live one is refused without it (stale-only mode, or a wrong lease id) and left as it was; a
//! live one named by its lease id is revoked — not free while its holder lives — and its holder,
//! a separate process, finds its guard lost; its release then frees the lock. Every break keeps the token, records who broke it, and the next holder's token is
//! greater.

use crate::support;

use std::time::{Duration, Instant};

use leasehold::{BreakMode, Error, Identity, LeaseBuilder, LeaseState, State};

#[test]
fn break_stale_refuse_live_and_break_by_lease_id() {
    let dir = support::tempdir();

    // A stale lease (same host, dead PID) is broken in stale-only mode.
    let stale = dir.path().join("stale.lock");
    let dead = support::dead_pid();
    support::write_atomic(
        &stale,
        &support::crafted(dead, 1, &Identity::current(), Duration::from_secs(60), 17).to_bytes(),
    );
    let b = leasehold::break_lease(&stale, BreakMode::Stale).expect("break a stale lease");
    assert!(!b.was_live);
    assert_eq!(b.verdict.state, State::Stale);
    let v = leasehold::status(&stale).unwrap();
    assert_eq!(v.state, State::Free, "{v}");
    let l = v.lease.unwrap();
    assert_eq!((l.state, l.token), (LeaseState::Released, 17));
    let ended = l.ended.unwrap();
    assert!(ended.how.starts_with("broken"), "{ended:?}");
    assert!(ended.by.is_some(), "who broke it: {ended:?}");
    eprintln!("break: stale lease broken: {}", ended.how);
    let g = LeaseBuilder::new(&stale).try_acquire().unwrap();
    assert!(g.token() > 17);
    g.release().unwrap();

    // A live lease, held by another process.
    let live = dir.path().join("live.lock");
    let ttl = Duration::from_millis(1500);
    let (mut holder, token, lease_id) = support::spawn_holder(&live, ttl, &[]);
    let before = std::fs::read(&live).unwrap();
    let e = leasehold::break_lease(&live, BreakMode::Stale).unwrap_err();
    eprintln!("break: live lease, no confirmation: {e}");
    assert!(matches!(e, Error::Refused { .. }), "{e:?}");
    assert_eq!(leasehold_cli::exit_code(&e), leasehold_cli::exit::TEMPFAIL);
    assert!(
        e.to_string().contains(&lease_id),
        "the refusal should say which id to name: {e}"
    );
    let wrong = "0".repeat(32);
    let e = leasehold::break_lease(&live, BreakMode::LeaseId(wrong)).unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e:?}");
    let v = leasehold::status(&live).unwrap();
    assert_eq!(v.state, State::Held, "{v}");
    assert_eq!(v.lease.as_ref().unwrap().lease_id, lease_id);
    let after = std::fs::read(&live).unwrap();
    assert_eq!(
        before.len(),
        after.len(),
        "refused breaks must not rewrite the lease"
    );
    // A loss would show at the holder's next renewal: wait for one, then look.
    support::wait_for_renewal(&live, ttl);
    assert!(
        holder.try_line("LOST", Duration::from_millis(50)).is_err(),
        "holder lost without a break"
    );

    // Named by its id, it is broken; the holder finds out at its next renewal (≤ TTL/3).
    let b = leasehold::break_lease(&live, BreakMode::LeaseId(lease_id.to_uppercase())).unwrap();
    let broke_at = Instant::now();
    assert!(b.was_live);
    let lost = holder.line("LOST", ttl);
    let noticed = broke_at.elapsed();
    eprintln!("break: live lease broken by id; holder lost after {noticed:?}: {lost}");
    assert!(
        lost.contains("broken") && lost.contains("revoked"),
        "{lost}"
    );
    assert!(
        noticed <= ttl / 3 + Duration::from_millis(300),
        "noticed late: {noticed:?}"
    );
    // Revoked, not freed: the lock stays taken while the old holder's process lives.
    assert_eq!(b.written, LeaseState::Revoked);
    let v = leasehold::status(&live).unwrap();
    assert_eq!(v.state, State::Held, "{v}");
    let l = v.lease.as_ref().unwrap();
    assert_eq!((l.state, l.token), (LeaseState::Revoked, token));
    let e = LeaseBuilder::new(&live).try_acquire().unwrap_err();
    assert!(matches!(e, Error::WouldBlock { .. }), "{e:?}");
    // The old holder, released on stdin EOF, frees it (its release of a revoked lease is the
    // end of its job).
    holder.close_stdin();
    holder.line("RELEASED", Duration::from_secs(5));
    assert!(holder.wait_timeout(Duration::from_secs(5)).success());
    let v = leasehold::status(&live).unwrap();
    assert_eq!(v.state, State::Free, "{v}");
    assert_eq!(v.lease.as_ref().unwrap().token, token);
    let g = LeaseBuilder::new(&live).try_acquire().unwrap();
    assert!(g.token() > token);
    assert!(!g.is_lost());
    g.release().unwrap();
}
