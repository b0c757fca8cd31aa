//! Taking a lease on S3: read the object, judge it, and replace it by a conditional PUT.
//!
//! Owns: one acquisition — probe that the server honours conditions; then, until taken or the
//! deadline: read the object (record and ETag), judge it with the file store's judge (a
//! same-host holder by its processes, any other by this process's own observation of its
//! heartbeat on CLOCK_BOOTTIME), stop a dead or hung same-host holder's leftovers as the file
//! store does, and take a free or stale lease with `If-None-Match: *` (no object) or
//! `If-Match: ETAG` (the object judged), the token one above the one judged. A refused write
//! (412/404) lost a race: read again. A write with an unknown outcome (5xx, 409, no answer) is
//! settled by reading: our lease id there, held, means it landed. A live holder is polled every
//! heartbeat (at most 1 s).
//! Must never: write without a condition; retry a write before reading; take a lease judged
//! held; trust the server's clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::holding::S3Holding;
use super::{CALL_TIMEOUT, Client, Cond, Put, S3Lock, encode};
use crate::boottime::BootInstant;
use crate::builder::LeaseBuilder;
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsio::LockContent;
use crate::guard::{LeaseGuard, Start};
use crate::identity::Identity;
use crate::judge::Judge;
use crate::observe::Memory;
use crate::record::LeaseState;
use crate::takeover;
use crate::verdict::{State, Verdict};

/// How long one call on the way to the lock may take: [`CALL_TIMEOUT`], and no longer than the
/// caller's deadline leaves (at least 100 ms).
fn call_limit(deadline: Option<Instant>) -> Duration {
    deadline.map_or(CALL_TIMEOUT, |d| {
        let left = d.saturating_duration_since(Instant::now());
        CALL_TIMEOUT.min(left).max(Duration::from_millis(100))
    })
}

/// Takes the lease on the S3 lock the builder names: at once or not at all (`one_shot`), or
/// waiting until `deadline` (for ever with `None`).
pub(crate) fn acquire(
    s: &LeaseBuilder,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Result<LeaseGuard> {
    let timing = s.timing()?;
    if s.want != crate::slots::Want::Exclusive {
        return Err(Error::Settings(format!(
            "{}: --shared and --slots are not supported on S3 locks yet",
            s.path.display()
        )));
    }
    let me = s.identity.clone().unwrap_or_else(Identity::current);
    let client = Arc::new(Client::new(S3Lock::parse(&s.path)?));
    let url = client.lock.url.clone();
    let started = Instant::now();
    // One lease id for the whole acquisition: a write of ours whose answer was lost is
    // recognised by it when it shows up held.
    let now = format_rfc3339(s.clock.wall());
    let mut lease = s.new_lease(&me, &timing, &now);
    let mut tried: Option<BootInstant> = None;
    let mut mem = Memory::default();
    let mut reported: Option<(String, State)> = None;
    let mut said_unavailable = false;
    // Takes refused on an ETag the object still had (see below).
    let mut stuck = 0;
    let poll = timing
        .heartbeat
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    // A cancelled wait (`LeaseBuilder::cancel`) ends at the next nap: nothing is queued here.
    let nap = || {
        sleep_until(s.cancel.as_ref(), poll, deadline);
        match &s.cancel {
            Some(c) if c.is_cancelled() => Err(Error::Cancelled {
                path: url.clone(),
                waited: started.elapsed(),
            }),
            _ => Ok(()),
        }
    };
    let timeout = |v: Verdict| Error::Timeout {
        path: url.clone(),
        waited: started.elapsed(),
        verdict: Box::new(v),
    };
    let judge = Judge {
        binding: &client.lock,
        me: &me,
        clock: s.clock.as_ref(),
        wall_skew: s.wall_skew,
        persist: false,
    };
    // The probe, asked again while an endpoint that cannot serve us (down, 5xx) may come back
    // before our deadline, as a read is below.
    loop {
        match client.probe(call_limit(deadline)) {
            Ok(()) => break,
            Err(e @ Error::Unavailable { .. }) if !one_shot => {
                let mut v = judge.judge(&LockContent::Missing, &mut Memory::default());
                v.reason.clear();
                v.behind = Some(format!(
                    "the S3 endpoint, which cannot serve us ({e}); asking again every {poll:?}"
                ));
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timeout(v));
                }
                if !said_unavailable && let Some(cb) = &s.on_wait {
                    (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(&v);
                    said_unavailable = true;
                }
                nap()?;
            }
            Err(e) => return Err(e),
        }
    }
    loop {
        let read = client.read(call_limit(deadline));
        let (content, etag) = match read {
            Ok((c, e, _)) => (c, e),
            Err(e @ Error::Unavailable { .. }) if !one_shot => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let mut v = judge.judge(&LockContent::Missing, &mut Memory::default());
                    v.reason.clear();
                    v.behind = Some(format!("the S3 endpoint, which cannot serve us ({e})"));
                    return Err(timeout(v));
                }
                if !said_unavailable && let Some(cb) = &s.on_wait {
                    let mut v = judge.judge(&LockContent::Missing, &mut Memory::default());
                    v.reason.clear();
                    v.behind = Some(format!(
                        "the S3 endpoint, which cannot serve us ({e}); asking again every {poll:?}"
                    ));
                    (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(&v);
                    said_unavailable = true;
                }
                nap()?;
                continue;
            }
            Err(e) => return Err(e),
        };
        // A write of ours whose answer was lost, landed: the lease is ours.
        if let (LockContent::Lease(l, b), Some(e), Some(sent)) = (&content, &etag, tried)
            && l.lease_id == lease.lease_id
            && l.state == LeaseState::Held
        {
            let (l, b) = (l.as_ref().clone(), b.clone());
            return hold(s, client, l, b, e.clone(), sent, timing, None);
        }
        let mut v = judge.judge(&content, &mut mem);
        let take = match v.state {
            State::Free => Ok(()),
            State::Stale => takeover::stop_old_job(&v, &client.lock).map(|_| ()),
            State::Hung if s.take_over_hung => takeover::stop_old_job(&v, &client.lock).map(|_| ()),
            State::Held | State::Hung => Err(String::new()),
        };
        match take {
            Ok(()) => {
                let prev = match &content {
                    LockContent::Lease(l, _) => l.token,
                    _ => 0,
                };
                let now = format_rfc3339(s.clock.wall());
                lease.token = prev + 1;
                lease.acquired_at = now.clone();
                lease.heartbeat_at = now;
                // What the new record carries forward (`ending.rs`): how the holding it
                // replaces ended (`died` or `broken` when taken over as stale or hung), the
                // last start, and this holding's `--max-time` deadline.
                let prev = match &content {
                    LockContent::Lease(l, _) => Some(l.as_ref()),
                    _ => None,
                };
                let reason = (v.state != State::Free).then_some(v.reason.as_str());
                lease.history = crate::ending::carried(prev, reason);
                lease.history.deadline = crate::ending::deadline(&lease.acquired_at, s.max_time);
                let record = lease.to_bytes();
                let (body, _) = encode(&record);
                let cond = match &etag {
                    None => Cond::Absent,
                    Some(e) => Cond::Match(e.clone()),
                };
                let sent = BootInstant::now();
                tried = Some(sent);
                match client.put(&body, &cond, call_limit(deadline))? {
                    Put::Done(e) => {
                        let broke = (v.state != State::Free).then_some(v);
                        return hold(s, client, lease, record, e, sent, timing, broke);
                    }
                    // Refused on the ETag the object still has, in both forms (see
                    // `Client::put_key`): a server that cannot compare ETags; never loop on it.
                    Put::Failed
                        if etag.is_some()
                            && matches!(client.get(call_limit(deadline)),
                                Ok(super::Got::Object { etag: now, .. }) if Some(&now) == etag.as_ref()) =>
                    {
                        stuck += 1;
                        if stuck >= 3 {
                            return Err(Error::UnsafeFileSystem {
                                path: url.clone(),
                                why:
                                    "the S3 server refuses If-Match with the very ETag it reports \
                                      for the object (quoted or not): it cannot be used for locks"
                                        .into(),
                            });
                        }
                        continue;
                    }
                    // Another contender changed it first, or we cannot tell: read again.
                    Put::Failed | Put::Unknown(_) => continue,
                }
            }
            Err(why) if !why.is_empty() => {
                if one_shot {
                    return Err(Error::Refused {
                        path: url.clone(),
                        why: format!("not taking over ({v}): {why}"),
                    });
                }
                v.reason = format!("{}; not taking over: {why}", v.reason);
            }
            Err(_) => {}
        }
        if one_shot {
            return Err(Error::WouldBlock {
                path: url.clone(),
                verdict: Box::new(v),
            });
        }
        let seen = (
            v.lease
                .as_ref()
                .map_or(String::new(), |l| l.lease_id.clone()),
            v.state,
        );
        if reported.as_ref() != Some(&seen)
            && let Some(cb) = &s.on_wait
        {
            (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(&v);
            reported = Some(seen);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(timeout(v));
        }
        nap()?;
    }
}

/// Sleeps `poll`, never past `deadline`, and no longer once `cancel` is cancelled.
fn sleep_until(cancel: Option<&crate::cancel::Cancel>, poll: Duration, deadline: Option<Instant>) {
    let left = deadline.map_or(poll, |d| d.saturating_duration_since(Instant::now()));
    crate::cancel::nap(cancel, poll.min(left));
}

/// The lease is ours: the guard counts from before the write that made it visible.
#[allow(clippy::too_many_arguments)]
fn hold(
    s: &LeaseBuilder,
    client: Arc<Client>,
    lease: crate::record::Lease,
    bytes: Vec<u8>,
    etag: String,
    sent: BootInstant,
    timing: crate::timing::Timing,
    broke: Option<Verdict>,
) -> Result<LeaseGuard> {
    let path = client.lock.url.clone();
    let holding = S3Holding::new(client, etag, timing.heartbeat);
    LeaseGuard::start(Start {
        path,
        timing,
        clock: Arc::clone(&s.clock),
        lease,
        bytes,
        started: sent,
        on_lost: s.on_lost.clone(),
        on_serve: s.on_serve.clone(),
        broke,
        holding,
    })
}
