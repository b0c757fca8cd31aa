//! A lease held on S3: what the guard renews, checks and releases through.
//!
//! Owns: the renewal (our record with its heartbeat moved, under a fresh nonce, PUT with
//! `If-Match` on the ETag we last wrote), the record's rewrite (the same, for `set_child`) and
//! the release (the same record marked released, PUT with `If-Match`; never a DELETE). A write
//! whose outcome is unknown (5xx, 409, no answer) is settled by a read: our nonce there means
//! it landed.
//! Must never: write over an object that is not our lease as we last wrote it (a breaker's
//! revoked mark, another contender's lease); count a renewal it cannot prove landed.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{CALL_TIMEOUT, Client, Cond, Put, encode};
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::loss::LossReason;
use crate::record::{Ending, Lease, LeaseState};
use crate::store::file::not_ours;
use crate::store::{Holding, Ours, Release, Renewal, ours};

/// Our lease on the lock's object, while held.
pub(crate) struct S3Holding {
    client: Arc<Client>,
    /// The ETag of the object as we last wrote it.
    etag: Mutex<String>,
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
    /// Not written; the object is still our lease, held (or revoked, when allowed), under the
    /// ETag given (which the next try uses).
    NotYet(String),
    /// Not written, and the object is not ours to write: what it is.
    No(Ours),
}

impl S3Holding {
    pub(crate) fn new(client: Arc<Client>, etag: String, every: Duration) -> Self {
        S3Holding {
            client,
            etag: Mutex::new(etag),
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
        let (body, nonce) = encode(record);
        let etag = lock(&self.etag).clone();
        let r = self
            .client
            .put(&body, &Cond::Match(etag.clone()), timeout)?;
        if let Put::Done(e) = r {
            *lock(&self.etag) = e;
            return Ok(Wrote::Yes);
        }
        // Refused, or unknown: what is there now says which.
        let (content, got_etag, got_nonce) = self.client.read(timeout)?;
        if got_nonce == nonce
            && let Some(e) = got_etag
        {
            *lock(&self.etag) = e;
            return Ok(Wrote::Yes);
        }
        let o = self.seen(ours(&content, lease_id));
        match (&o, got_etag) {
            (Ours::Held, Some(e)) => Ok(Wrote::NotYet(e)),
            (Ours::Revoked(_), Some(e)) if revoked_ok => Ok(Wrote::NotYet(e)),
            _ => Ok(Wrote::No(o)),
        }
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
        let (content, _, _) = self.client.read(self.timeout.max(CALL_TIMEOUT))?;
        Ok(self.seen(ours(&content, lease_id)))
    }

    fn renew(&self, lease_id: &str, bytes: &[u8]) -> std::result::Result<(), Renewal> {
        match self.write(lease_id, bytes, self.timeout, false) {
            Ok(Wrote::Yes) => Ok(()),
            // Still ours, under an ETag we had not seen (a write of ours whose answer was lost
            // landed after all): the next renewal writes over it.
            Ok(Wrote::NotYet(e)) => {
                *lock(&self.etag) = e;
                Err(Renewal::Transient(Error::Settings(
                    "the lock's object changed under our renewal; retrying".into(),
                )))
            }
            Ok(Wrote::No(o)) => Err(Renewal::Lost(not_ours(o))),
            Err(e @ Error::NotALease { .. }) => Err(Renewal::Lost(LossReason::Vanished {
                what: e.to_string(),
            })),
            Err(e) => Err(Renewal::Transient(e)),
        }
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
                Wrote::NotYet(e) => *lock(&self.etag) = e,
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
            let etag = lock(&self.etag).clone();
            let (body, _) = encode(&self.released(&release));
            let quick = Duration::from_millis(300);
            // Refused at once (the gateway answers): a break's revoked mark on our record,
            // which we release over; anything else is not ours.
            if let Ok(Put::Failed) = self.client.put(&body, &Cond::Match(etag), quick)
                && let Ok((content, Some(e), _)) = self.client.read(quick)
                && matches!(
                    self.seen(ours(&content, &lease_id)),
                    Ours::Held | Ours::Revoked(_)
                )
            {
                let (body, _) = encode(&self.released(&release));
                let _ = self.client.put(&body, &Cond::Match(e), quick);
            }
            return Ok(());
        }
        let timeout = release.wait.clamp(Duration::from_millis(100), CALL_TIMEOUT);
        for _ in 0..3 {
            // Made anew each time: a try that found our record revoked names the breaker.
            let bytes = self.released(&release);
            match self.write(&lease_id, &bytes, timeout, true)? {
                Wrote::Yes => return Ok(()),
                // Revoked by a break, or our own late write: release over it.
                Wrote::NotYet(e) => *lock(&self.etag) = e,
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
