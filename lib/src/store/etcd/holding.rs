//! A lease held on etcd: what the guard renews, checks and releases through.
//!
//! Owns: the renewal (one keepalive of our etcd lease, answered with a TTL above zero — on the
//! open stream, or on one opened at once on another member when that stream broke — then a
//! read of our key: still there, still ours by its create revision, not marked revoked), the
//! record's rewrite (only over the record we last wrote, compared by mod revision, with our
//! job record `EtcdLock::job_key` beside it) and the release (deleting our key and our job
//! record in one transaction, which wakes the contender behind us; our etcd lease is revoked
//! too after a fence, and instead when that could not be done). Our job record is left behind
//! only when we die or are cut off.
//! Must never: count a keepalive that was not answered with a live TTL; write over a record
//! we did not write last (a breaker's revoked mark); release before the guard has stopped
//! renewing.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, LeaseKeepAliveStream, LeaseKeeper};
use etcd_client::{PutOptions, Txn, TxnOp, TxnResponse};

use super::look::record;
use super::{CALL_TIMEOUT, Conn};
use crate::error::{Error, Result};
use crate::loss::LossReason;
use crate::record::{Lease, LeaseState};
use crate::store::{Holding, Ours, Release, Renewal};

/// Our etcd lease and key, while held.
pub(crate) struct EtcdHolding {
    conn: Arc<Conn>,
    /// Our etcd lease.
    id: i64,
    /// Our key, `NAME/<id in hex>`.
    key: String,
    /// Its create revision: our token.
    rev: i64,
    /// How long one renewal may take before it is retried.
    timeout: Duration,
    /// The keepalive stream, opened at the first renewal and again after an error.
    ka: Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// The mod revision of the record we last wrote.
    last_mod: Mutex<i64>,
    /// Who marked our key revoked (`break`), once a read showed it: recorded at release.
    revoked_by: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EtcdHolding {
    pub(crate) fn new(conn: Arc<Conn>, id: i64, key: String, rev: i64, every: Duration) -> Self {
        EtcdHolding {
            conn,
            id,
            key,
            rev,
            // Short: a renewal stuck on a frozen cluster holds up the release after a fence.
            timeout: (every / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            ka: Mutex::new(None),
            last_mod: Mutex::new(rev),
            revoked_by: Mutex::new(None),
        }
    }

    /// Our key as the store holds it now.
    fn read(&self, timeout: Duration) -> Result<Option<KeyValue>> {
        let key = self.key.clone();
        let mut r = self.conn.call("read our key", timeout, |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        Ok(r.take_kvs().into_iter().next())
    }

    /// Whether `kv` (our key as read) is still our lease, held.
    fn ours(&self, kv: Option<&KeyValue>) -> Ours {
        let Some(kv) = kv else {
            return Ours::Missing;
        };
        let (l, _) = record(kv);
        if kv.create_revision() != self.rev {
            return Ours::Taken(l.holder.describe(), l.token);
        }
        match l.state {
            LeaseState::Revoked => {
                let by = l.ended.and_then(|e| e.by);
                lock(&self.revoked_by).clone_from(&by);
                Ours::Revoked(by)
            }
            _ => Ours::Held,
        }
    }

    /// One keepalive, answered: whether the server still keeps our lease (a TTL above zero).
    /// On the open stream first; a stream that broke or does not answer within half our time
    /// (its member killed, cut off, without a leader) is replaced at once by one opened on
    /// whichever member answers, within the same renewal.
    fn keepalive(&self) -> std::result::Result<bool, Renewal> {
        let mut slot = lock(&self.ka);
        let started = std::time::Instant::now();
        if let Some(mut pair) = slot.take() {
            let (keeper, stream) = (&mut pair.0, &mut pair.1);
            let answer = self.conn.block_on(async {
                let renewed = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                tokio::time::timeout(self.timeout / 2, renewed).await
            });
            if let Ok(Ok(Some(r))) = answer {
                *slot = Some(pair);
                return Ok(r.ttl() > 0);
            }
        }
        // Opening a stream sends one keepalive and reads its answer: a TTL of 0 is an error.
        let left = self.timeout.saturating_sub(started.elapsed());
        let id = self.id;
        let opened = self.conn.call("renew the lease", left, |c| async move {
            match c.lease_client().keep_alive(id).await {
                Ok(pair) => Ok(Some(pair)),
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match opened.map_err(Renewal::Transient)? {
            Some(pair) => {
                *slot = Some(pair);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

impl EtcdHolding {
    /// Puts our record over the one we wrote last (mod revision `last`), and with `job` our job
    /// record too, in one transaction.
    fn put_record(&self, last: i64, bytes: &[u8], job: bool) -> Result<TxnResponse> {
        let mut ops = vec![TxnOp::put(
            self.key.clone(),
            bytes.to_vec(),
            Some(PutOptions::new().with_lease(self.id)),
        )];
        if job {
            // Kept past our key (no lease): if we die, the next owner on this host finds what
            // our command left in its group and stops it before its own starts.
            ops.push(TxnOp::put(
                self.conn.lock.job_key(self.id),
                bytes.to_vec(),
                None,
            ));
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.key.clone(),
                CompareOp::Equal,
                last,
            )])
            .and_then(ops);
        self.conn.txn("record the command", CALL_TIMEOUT, txn)
    }
}

impl Holding for EtcdHolding {
    type Section = ();

    fn still_ours(&self, _lease_id: &str) -> Result<Ours> {
        Ok(self.ours(self.read(self.timeout)?.as_ref()))
    }

    fn renew(&self, _lease_id: &str, _bytes: &[u8]) -> std::result::Result<(), Renewal> {
        let vanished = |what: String| Err(Renewal::Lost(LossReason::Vanished { what }));
        let taken = |by: String| Err(Renewal::Lost(LossReason::Taken { by }));
        if !self.keepalive()? {
            return vanished(format!(
                "etcd lease {:x} expired or was revoked on the cluster",
                self.id
            ));
        }
        let kv = self.read(self.timeout).map_err(Renewal::Transient)?;
        match self.ours(kv.as_ref()) {
            Ours::Held => Ok(()),
            Ours::Revoked(by) => Err(Renewal::Lost(LossReason::Broken {
                how: LossReason::revoked(by),
            })),
            Ours::Taken(by, token) => taken(format!("held by {by} (token {token})")),
            _ => vanished(format!("our key {} is gone", self.key)),
        }
    }

    fn enter(&self, _deadline: std::time::Instant, _stuck: Duration) -> Result<()> {
        Ok(())
    }

    fn rewrite(&self, _: &(), mine: &Lease, bytes: &[u8]) -> Result<()> {
        let mut last = lock(&self.last_mod);
        let job = mine.holder.pgid.is_some() && self.conn.keeps_jobs();
        let r = match self.put_record(*last, bytes, job) {
            // A user allowed only the lock's prefix: record without our job record (the
            // remnant rule at takeover then cannot apply; PROTOCOL.md §14 says so).
            Err(e) if job && self.conn.jobs_denied(&e) => self.put_record(*last, bytes, false)?,
            r => r?,
        };
        if !r.succeeded() {
            return Err(Error::Lost {
                path: self.conn.lock.url.clone(),
                lease_id: mine.lease_id.clone(),
                why: format!("our key {} was revoked, replaced or deleted", self.key),
            });
        }
        if let Some(h) = r.header() {
            *last = h.revision();
        }
        Ok(())
    }

    fn release(&self, r: Release<'_>) -> Result<()> {
        (r.stop)();
        drop(lock(&self.ka).take());
        // Short: a cluster that does not answer lets the lease expire on its own.
        let wait = r.wait.min(Duration::from_millis(500));
        let started = std::time::Instant::now();
        // Our command is over. One transaction deletes our key, while it is still ours, and our
        // job record: the contender watching our key wakes at once, and never finds the record
        // of a holder that let go.
        let mut ops = vec![TxnOp::delete(self.key.clone(), None)];
        // With how we ended, in the lock's history (`ending.rs`): only while the key is ours.
        let conn = &self.conn;
        let by = lock(&self.revoked_by).clone();
        ops.extend(super::ending::released(conn, r.mine, r.how, by, r.clock));
        let mut otherwise = vec![];
        if self.conn.keeps_jobs() {
            let job = TxnOp::delete(self.conn.lock.job_key(self.id), None);
            ops.push(job.clone());
            otherwise.push(job);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then(ops)
            .or_else(otherwise);
        let deleted = self
            .conn
            .txn("let go of our key", wait, txn)
            .is_ok_and(|r| r.succeeded());
        if deleted && !r.lost {
            // Our key and record are gone: the lease, holding nothing, expires on its own within
            // its TTL. Revoking it would be a second Raft commit, racing the next owner's read.
            return Ok(());
        }
        // Fenced (the lease is revoked on fencing, whatever became of our key), our key not ours
        // to delete any more (expired, or deleted by hand), or the cluster did not answer:
        // revoke, so that nothing waits for the server's TTL.
        let left = wait
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(100));
        match self.conn.revoke("revoke the lease", left, self.id) {
            Ok(()) => Ok(()),
            Err(e) if e.to_string().contains("requested lease not found") => Ok(()),
            // Our key is gone already: the lease, holding nothing, expires on its own.
            Err(_) if deleted => Ok(()),
            Err(e) => Err(e),
        }
    }
}
