//! The etcd store's memory of how holdings end (PROTOCOL.md §14 *Endings*, §16).
//!
//! Owns: the lock's *history* key, `leasehold:history:<NAME escaped>` — outside the lock's
//! prefix, so it never joins the line and `etcdctl lock NAME` still excludes us — holding one
//! §2 record: the current holder's, held, written once it is first (what it carries: the
//! ending before it, the last start, its `--max-time` deadline), or the last holder's,
//! released with how it ended (written in the release's own transaction, with the deletion of
//! its key), or marked broken by `break`. Reading it at a take (`start`: a held or revoked
//! record whose holder's key is gone is a holding that `died`, or was `broken`), what `status`
//! shows of it, and `ack`. Must never: write the history but through a transaction guarded by
//! the writer's right to (the holder's own key still its own; `break` and `ack` on the
//! history's mod revision as read), so that a fenced or expired holder never overwrites its
//! successor's history; decide anything about who may hold the lock (policy on top of the
//! lease: nothing here is part of §14's safety argument).

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::look::record;
use super::{CALL_TIMEOUT, Conn, EtcdLock};
use crate::clock::{Clock, format_rfc3339};
use crate::ending::{Acked, carried, deadline};
use crate::error::{Error, Result};
use crate::record::{Ending, Lease, LeaseState, Parsed};

/// The words a taker records for a holding whose history says it was held (or revoked) but
/// whose key is gone: its etcd lease expired (or was revoked) before it could record its end.
const KEY_GONE: &str =
    "its etcd key is gone: its lease expired or was revoked before it recorded its end";

impl EtcdLock {
    /// The lock's history key: `leasehold:history:` and the name with `%`, `/` and `:` escaped
    /// as in [`EtcdLock::jobs_prefix`]. It holds no `/`, so it lies under no lock's prefix.
    pub(crate) fn history_key(&self) -> String {
        let name = self
            .name
            .replace('%', "%25")
            .replace('/', "%2F")
            .replace(':', "%3A");
        format!("leasehold:history:{name}")
    }
}

/// The history as read: its record (`None`: absent, or not a lease record) and its mod
/// revision (0: absent), which a writer other than the holder compares.
pub(crate) struct History {
    pub rec: Option<Lease>,
    pub mod_rev: i64,
}

impl History {
    fn of(kv: Option<&KeyValue>) -> History {
        let Some(kv) = kv else {
            return History {
                rec: None,
                mod_rev: 0,
            };
        };
        let rec = match Lease::parse(kv.value()) {
            Parsed::Lease(l) if !l.damaged => Some(*l),
            _ => None,
        };
        History {
            rec,
            mod_rev: kv.mod_revision(),
        }
    }

    /// The compare that holds while the history is still the one read.
    fn unchanged(&self, key: &str) -> Compare {
        Compare::mod_revision(key.to_string(), CompareOp::Equal, self.mod_rev)
    }
}

/// The lock's history, read (linearizably).
pub(crate) fn read(conn: &Conn) -> Result<History> {
    let key = conn.lock.history_key();
    let mut r = conn.run("read the lock's history", |mut c| {
        let key = key.clone();
        async move { c.get(key, None).await }
    })?;
    Ok(History::of(r.take_kvs().first()))
}

/// The history a holder whose record is `rec` carries, from `prev` (the history as read): a
/// released record's ending; a held or revoked one of another lease — its holder's key is
/// gone, since ours is first — is `died` (or `broken`, revoked or marked by `break`).
fn carried_from(prev: Option<&Lease>, ours: &str) -> crate::ending::History {
    let prev = prev.filter(|p| p.lease_id != ours);
    let reason = prev
        .filter(|p| p.state != LeaseState::Released)
        .map(|_| KEY_GONE);
    carried(prev, reason)
}

/// First in line, before the guard starts: reads the history, sets what `lease` (ours, with
/// its lease id and token) carries — the ending before it, the last start, its `--max-time`
/// deadline — and writes it as the history, held, in a transaction guarded by our key (`key`,
/// create revision `rev`) and by the history's mod revision as read (an `ack` or `break`
/// landing in between makes us read it again). Our key gone meanwhile: [`Error::Lost`]. A user
/// not allowed the history key takes the lock without endings (nothing carried).
pub(crate) fn start(
    conn: &Conn,
    key: &str,
    rev: i64,
    lease: &mut Lease,
    max_time: Option<std::time::Duration>,
) -> Result<()> {
    let hkey = conn.lock.history_key();
    for _ in 0..4 {
        let h = match read(conn) {
            Err(e) if conn.history_denied(&e) => return without(lease, max_time),
            r => r?,
        };
        // Our own start already (a write whose answer was lost landed, and failing over sent
        // it again, which its compare refused): what it carried stands.
        if let Some(mine) = h
            .rec
            .as_ref()
            .filter(|r| r.lease_id == lease.lease_id && r.state == LeaseState::Held)
        {
            lease.history = mine.history.clone();
            return Ok(());
        }
        lease.history = carried_from(h.rec.as_ref(), &lease.lease_id);
        lease.history.deadline = deadline(&lease.acquired_at, max_time);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.to_string(), CompareOp::Equal, rev),
                h.unchanged(&hkey),
            ])
            .and_then([TxnOp::put(hkey.clone(), lease.to_bytes(), None)])
            .or_else([TxnOp::get(key.to_string(), None)]);
        let r = match conn.txn("record our start in the lock's history", CALL_TIMEOUT, txn) {
            Err(e) if conn.history_denied(&e) => return without(lease, max_time),
            r => r?,
        };
        if r.succeeded() {
            return Ok(());
        }
        let still = match r.op_responses().first() {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().map(KeyValue::create_revision),
            _ => None,
        };
        if still != Some(rev) {
            return Err(Error::Lost {
                path: conn.lock.url.clone(),
                lease_id: lease.lease_id.clone(),
                why: format!("our key {key} went before our start was recorded"),
            });
        }
    }
    Err(Error::io(
        &conn.lock.url,
        "record our start in the lock's history",
        std::io::Error::other("the history kept changing under us (ack or break)"),
    ))
}

/// No history for this user: nothing carried, only the deadline.
fn without(lease: &mut Lease, max_time: Option<std::time::Duration>) -> Result<()> {
    lease.history = crate::ending::History {
        deadline: deadline(&lease.acquired_at, max_time),
        ..Default::default()
    };
    Ok(())
}

/// The history write of a release (`None`: nothing to write), to go in the release's own
/// transaction, which deletes our key only while it is still ours: our record `mine`,
/// released, ended `how` now — `by` the breaker who marked our key revoked, if a renewal saw
/// that (the ending is then `broken`).
pub(crate) fn released(
    conn: &Conn,
    mine: &Lease,
    how: &str,
    by: Option<String>,
    clock: &dyn Clock,
) -> Option<TxnOp> {
    if !conn.keeps_history() {
        return None;
    }
    let mut rec = mine.clone();
    rec.state = LeaseState::Released;
    rec.ended = Some(Ending {
        at: format_rfc3339(clock.wall()),
        how: how.to_string(),
        by,
    });
    Some(TxnOp::put(conn.lock.history_key(), rec.to_bytes(), None))
}

/// `break` of the owner `kv` (its record `owner`): records in the history, if it names that
/// holding, that it was broken — `how`, `by` — released (a stale holder, its key about to be
/// revoked) or revoked (a live one, which fences; its own release then records the same
/// breaker). Best effort: guarded by the owner's key and the history as read; a history that
/// names another holding (an owner that had not recorded its start, an `etcdctl lock` holder)
/// is left alone.
pub(crate) fn broken(conn: &Conn, kv: &KeyValue, owner: &Lease, ended: &Ending, revoked: bool) {
    let Ok(h) = read(conn) else { return };
    let Some(mut rec) = h
        .rec
        .clone()
        .filter(|r| r.lease_id == owner.lease_id && r.state == LeaseState::Held)
    else {
        return;
    };
    rec.state = if revoked {
        LeaseState::Revoked
    } else {
        LeaseState::Released
    };
    rec.ended = Some(ended.clone());
    let hkey = conn.lock.history_key();
    let txn = Txn::new()
        .when([
            Compare::create_revision(kv.key().to_vec(), CompareOp::Equal, kv.create_revision()),
            h.unchanged(&hkey),
        ])
        .and_then([TxnOp::put(hkey, rec.to_bytes(), None)]);
    let _ = conn.txn("record the break in the lock's history", CALL_TIMEOUT, txn);
}

/// The record `status` shows for a lock nobody owns, from its history: a released record as
/// it is; a held or revoked one (its holder's key gone, its end not recorded yet) as the next
/// holder will record it — `died`, or `broken` when revoked — found so at `now`.
fn as_free(rec: Lease, now: &str) -> Lease {
    let mut out = rec;
    if out.state == LeaseState::Released {
        return out;
    }
    if out.ended.as_ref().is_none_or(|e| e.by.is_none()) {
        out.ended = Some(Ending {
            at: now.to_string(),
            how: format!("died: {KEY_GONE} (the next holder records it so)"),
            by: None,
        });
    }
    out.state = LeaseState::Released;
    out
}

/// `status`: what the lock's history adds to the verdict `v` on the owner `owner` — the
/// owner's deadline, last start and the ending before it, or (nobody owns the lock) the last
/// holding's record, as a file lock's released record shows it.
pub(crate) fn annotate(conn: &Conn, v: &mut crate::verdict::Verdict, owner: Option<&KeyValue>) {
    let Ok(h) = read(conn) else { return };
    let now = format_rfc3339(v.judged_at);
    match (owner, v.lease.as_mut()) {
        (Some(_), Some(l)) => match h.rec {
            // The holder's own record, written once it was first: its acquisition time
            // (its key's record says when it joined the line) and what it carries.
            Some(rec) if rec.lease_id == l.lease_id => {
                l.acquired_at = rec.acquired_at;
                l.history = rec.history;
            }
            rec => l.history = carried_from(rec.as_ref(), &l.lease_id),
        },
        _ => v.lease = h.rec.map(|r| as_free(r, &now)),
    }
}

/// `leasehold ack` of an etcd lock: its history's ending acknowledged, as on a file (the same
/// checks: no owner, a released record, an unclean ending not acknowledged yet), the write
/// guarded by the history's mod revision as read (a holder starting in between wins; looked
/// at again).
pub(crate) fn ack(path: &std::path::Path, by: &str) -> Result<Acked> {
    let conn = Conn::connect(EtcdLock::parse(path)?)?;
    let hkey = conn.lock.history_key();
    let refuse = |why: String| Error::Refused {
        path: conn.lock.url.clone(),
        why,
    };
    for _ in 0..4 {
        let prefix = conn.lock.prefix();
        let txn = Txn::new().and_then([
            TxnOp::get(prefix, Some(super::look::first())),
            TxnOp::get(hkey.clone(), None),
        ]);
        let r = conn.txn("read the lock's history", CALL_TIMEOUT, txn)?;
        let kv = |i: usize| match r.op_responses().get(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
            _ => None,
        };
        if let Some(owner) = kv(0) {
            return Err(refuse(format!(
                "the lock is held ({}): acknowledge once it is released",
                record(&owner).0.holder.describe()
            )));
        }
        let h = History::of(kv(1).as_ref());
        let Some(rec) = h.rec.clone() else {
            return Err(refuse("no ending is recorded in this lock".into()));
        };
        let (write, out) = crate::ending::ack_record(&conn.lock.url, &rec, by)?;
        let Some(new) = write else {
            return Ok(out);
        };
        let txn = Txn::new().when([h.unchanged(&hkey)]).and_then([TxnOp::put(
            hkey.clone(),
            new.to_bytes(),
            None,
        )]);
        if conn
            .txn("record the acknowledgement", CALL_TIMEOUT, txn)?
            .succeeded()
        {
            return Ok(out);
        }
    }
    Err(refuse(
        "the lock's history kept changing: look at `leasehold status` and try again".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_history_key_lies_under_no_locks_prefix_nor_another_locks_history() {
        let l = EtcdLock::parse(Path::new("etcd://a:1/jobs/nightly%x")).unwrap();
        assert_eq!(l.history_key(), "leasehold:history:jobs%2Fnightly%25x");
        assert!(!l.history_key().contains('/'));
        let a = EtcdLock::parse(Path::new("etcd://a:1/a")).unwrap();
        let ab = EtcdLock::parse(Path::new("etcd://a:1/a:b")).unwrap();
        assert_ne!(a.history_key(), ab.history_key());
        assert!(!ab.history_key().starts_with(&a.jobs_prefix()));
    }
}
