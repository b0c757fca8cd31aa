//! A lease held on S3: what the guard renews, checks and releases through.
//!
//! Owns: the renewal (our record with its heartbeat moved, under a fresh nonce, PUT with
//! `If-Match` on the ETag we last wrote), the record's rewrite (the same, for `set_child`) and
//! the release (the same record marked released, PUT with `If-Match`; never a DELETE). Our
//! record is one entry of the object (LOCK's, or a shared or counted holder's beside the other
//! holders'): a write replaces that entry in the object as we last saw it, and a write refused
//! because another holder wrote its own entry meanwhile is made again on the object as it is
//! now, while our entry there is still our lease. A write whose outcome is unknown (5xx, 409,
//! no answer) is settled by a read: our nonce there means it landed.
//! Must never: write over an object that is not our lease as we last wrote it (a breaker's
//! revoked mark, another contender's lease); count a renewal it cannot prove landed.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{CALL_TIMEOUT, Client, Object, Put};
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::loss::LossReason;
use crate::record::{Ending, Lease, LeaseState};
use crate::store::file::not_ours;
use crate::store::{Holding, Ours, Release, Renewal, ours};

/// Our lease on the lock's object, while held.
pub(crate) struct S3Holding {
    client: Arc<Client>,
    /// Which entry of the object is our record (0: LOCK's; K + 1: holder K's).
    entry: usize,
    /// The object as we last wrote or read it (its ETag, the others' records).
    object: Mutex<Object>,
    /// How long one renewal's request may take before it is retried.
    timeout: Duration,
    /// Who marked our record revoked (`break`), once a read showed it: recorded at release,
    /// so that the ending reads `broken` (`ending.rs`).
    revoked_by: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How one conditional write of ours came out, settled.
enum Wrote {
    Yes,
    /// Not written; our entry is still our lease, held (or revoked, when allowed), in the
    /// object as now read (which the next try writes over).
    NotYet,
    /// Not written, and the object is not ours to write: what it is.
    No(Ours),
}

impl S3Holding {
    pub(crate) fn new(client: Arc<Client>, entry: usize, object: Object, every: Duration) -> Self {
        S3Holding {
            client,
            entry,
            object: Mutex::new(object),
            // Short: a renewal stuck on a frozen gateway holds up the release after a fence.
            timeout: (every / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            revoked_by: Mutex::new(None),
        }
    }

    /// One conditional write of `record` over the ETag we last wrote, settled by a read when
    /// its outcome is unknown or it was refused. `revoked_ok`: a revoked record of ours may be
    /// written over (a release).
    fn write(
        &self,
        lease_id: &str,
        record: &[u8],
        timeout: Duration,
        revoked_ok: bool,
    ) -> Result<Wrote> {
        let object = lock(&self.object).clone();
        let (body, nonce) = object.with(self.entry, record);
        if let Put::Done(e) = self.client.put(&body, &object.cond(), timeout)? {
            lock(&self.object).wrote(self.entry, record, e, nonce);
            return Ok(Wrote::Yes);
        }
        // Refused, or unknown: what is there now says which.
        let now = self.client.object(timeout)?;
        if now.nonce == nonce && now.etag.is_some() {
            *lock(&self.object) = now;
            return Ok(Wrote::Yes);
        }
        let content = now.content(&self.client.lock.url, self.entry)?;
        let o = self.seen(ours(&content, lease_id));
        let again = now.etag.is_some()
            && (o == Ours::Held || (revoked_ok && matches!(o, Ours::Revoked(_))));
        if again {
            *lock(&self.object) = now;
            return Ok(Wrote::NotYet);
        }
        Ok(Wrote::No(o))
    }
}

impl S3Holding {
    /// `o`, remembering who revoked our record if it says.
    fn seen(&self, o: Ours) -> Ours {
        if let Ours::Revoked(by) = &o {
            lock(&self.revoked_by).clone_from(by);
        }
        o
    }

    /// Our record `mine`, released: ended `how` now (by the breaker who revoked it, if seen).
    fn released(&self, r: &Release<'_>) -> Vec<u8> {
        let mut rec = r.mine.clone();
        rec.state = LeaseState::Released;
        rec.damaged = false;
        rec.ended = Some(Ending {
            at: format_rfc3339(r.clock.wall()),
            how: r.how.to_string(),
            by: lock(&self.revoked_by).clone(),
        });
        rec.to_bytes()
    }
}

impl Holding for S3Holding {
    type Section = ();

    fn still_ours(&self, lease_id: &str) -> Result<Ours> {
        let object = self.client.object(self.timeout.max(CALL_TIMEOUT))?;
        let content = object.content(&self.client.lock.url, self.entry)?;
        Ok(self.seen(ours(&content, lease_id)))
    }

    fn renew(&self, lease_id: &str, bytes: &[u8]) -> std::result::Result<(), Renewal> {
        // Still ours, in an object changed since we wrote it (another holder renewed its own
        // entry, or a write of ours whose answer was lost landed after all): written again
        // over the object as it is now, a few times, then left to the next try.
        for _ in 0..3 {
            match self.write(lease_id, bytes, self.timeout, false) {
                Ok(Wrote::Yes) => return Ok(()),
                Ok(Wrote::NotYet) => continue,
                Ok(Wrote::No(o)) => return Err(Renewal::Lost(not_ours(o))),
                Err(e @ Error::NotALease { .. }) => {
                    return Err(Renewal::Lost(LossReason::Vanished {
                        what: e.to_string(),
                    }));
                }
                Err(e) => return Err(Renewal::Transient(e)),
            }
        }
        Err(Renewal::Transient(Error::Settings(
            "the lock's object kept changing under our renewal; retrying".into(),
        )))
    }

    fn enter(&self, _deadline: Instant, _stuck_after: Duration) -> Result<()> {
        Ok(())
    }

    fn rewrite(&self, _section: &(), mine: &Lease, bytes: &[u8]) -> Result<()> {
        let lost = |o: Ours| Error::Lost {
            path: self.client.lock.url.clone(),
            lease_id: mine.lease_id.clone(),
            why: not_ours(o).to_string(),
        };
        for _ in 0..3 {
            match self.write(&mine.lease_id, bytes, CALL_TIMEOUT, false)? {
                Wrote::Yes => return Ok(()),
                Wrote::NotYet => {}
                Wrote::No(o) => return Err(lost(o)),
            }
        }
        Err(Error::Unavailable {
            path: self.client.lock.url.clone(),
            op: "record the command in the lock's object",
            why: "the object kept changing under our writes".into(),
        })
    }

    fn release(&self, release: Release<'_>) -> Result<()> {
        (release.stop)();
        let lease_id = release.mine.lease_id.clone();
        if release.lost {
            // Fenced already: one quick try to free the lock for the next contender at once; a
            // gateway that does not answer (the likely cause of the loss) must not hold up our
            // exit — the record then goes stale by observation within its TTL.
            let object = lock(&self.object).clone();
            let record = self.released(&release);
            let (body, _) = object.with(self.entry, &record);
            let quick = Duration::from_millis(300);
            // Refused at once (the gateway answers): a break's revoked mark on our record, or
            // another holder's write, which we release over; anything else is not ours.
            if let Ok(Put::Failed) = self.client.put(&body, &object.cond(), quick)
                && let Ok(now) = self.client.object(quick)
                && now.etag.is_some()
                && let Ok(content) = now.content(&self.client.lock.url, self.entry)
                && matches!(
                    self.seen(ours(&content, &lease_id)),
                    Ours::Held | Ours::Revoked(_)
                )
            {
                let (body, _) = now.with(self.entry, &self.released(&release));
                let _ = self.client.put(&body, &now.cond(), quick);
            }
            return Ok(());
        }
        let timeout = release.wait.clamp(Duration::from_millis(100), CALL_TIMEOUT);
        for _ in 0..3 {
            // Made anew each time: a try that found our record revoked names the breaker.
            let bytes = self.released(&release);
            match self.write(&lease_id, &bytes, timeout, true)? {
                Wrote::Yes => return Ok(()),
                // Revoked by a break, another holder's write, or our own late write: release
                // over it.
                Wrote::NotYet => {}
                // Not ours any more (taken, broken, replaced): nothing of ours to release.
                Wrote::No(_) => return Ok(()),
            }
        }
        Err(Error::Unavailable {
            path: self.client.lock.url.clone(),
            op: "release the lease",
            why: "the object kept changing under our writes".into(),
        })
    }
}
