//! `status` and `break` of an etcd lock, and the verdict on the contender that owns it.
//!
//! Owns: reading who owns the lock (the key with the lowest create revision under `NAME/`)
//! and who waits, judging the owner (a leasehold holder by its record; an `etcdctl lock`
//! holder, whose key holds no record, as such), and the operator's break: a live leasehold
//! holder's record is marked revoked in place (its key, create revision and etcd lease kept,
//! so nobody behind it moves until the holder has fenced and revoked its lease, or the lease
//! expired); a holder verified dead on this host has what is left of its job stopped
//! (verified) and its etcd lease revoked at once.
//! Must never: free a live holder's key (that would let the next contender start while the
//! old command may still run); break an `etcdctl lock` holder, which cannot be fenced; signal
//! a process that /proc does not verify as the job of this lock and lease.

use std::path::Path;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget};
use etcd_client::{Txn, TxnOp};

use super::{CALL_TIMEOUT, Conn, EtcdLock};
use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::judge;
use crate::process::{self, Liveness};
use crate::record::{Ending, Holder, Lease, LeaseState, Parsed};
use crate::status::outcome::{BreakMode, Broken, Frees};
use crate::takeover;
use crate::verdict::{ServerLease, State, Verdict, Waiting};

/// Options to get the owner: the first key by create revision under the prefix.
pub(crate) fn first() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The record a key holds: leasehold's lease (its token and lease id taken from the key, which
/// cannot lie about them), or, for a key without one (`etcdctl lock`), a stand-in naming it.
pub(crate) fn record(kv: &KeyValue) -> (Lease, bool) {
    // Leasehold's lease ids are 32 hex digits: the etcd lease id, zero-padded.
    let lease_id = format!("{:032x}", kv.lease());
    let token = kv.create_revision().max(0) as u64;
    match Lease::parse(kv.value()) {
        Parsed::Lease(l) => {
            let mut l = *l;
            l.lease_id = lease_id;
            l.token = token;
            (l, true)
        }
        _ => (
            Lease {
                state: LeaseState::Held,
                heartbeat_seq: 0,
                heartbeat_at: String::new(),
                token,
                ttl_ms: 0,
                acquired_at: String::new(),
                holder: Holder {
                    pid: 0,
                    pid_start: 0,
                    child_pid: None,
                    child_start: None,
                    pgid: None,
                    host: String::new(),
                    boot_id: String::new(),
                    pid_ns: 0,
                    uid: 0,
                    user: String::new(),
                    command: Vec::new(),
                    note: Some(format!("etcdctl lock holder, lease {:x}", kv.lease())),
                    on_behalf: false,
                },
                lease_id,
                ended: None,
                mode: None,
                history: Default::default(),
                damaged: false,
            },
            false,
        ),
    }
}

/// The verdict on the lock `lock` whose owner key is `owner`, as `me` sees it.
pub(crate) fn verdict(
    lock: &EtcdLock,
    owner: Option<&KeyValue>,
    me: &Identity,
    clock: &dyn Clock,
) -> Verdict {
    let Some(kv) = owner else {
        return free(lock, clock);
    };
    let (lease, ours) = record(kv);
    let mut v = free(lock, clock);
    v.state = State::Held;
    v.reason = if !ours {
        format!("etcdctl lock holder, lease {:x}", kv.lease())
    } else if lease.state == LeaseState::Revoked {
        let by = lease.ended.as_ref().and_then(|e| e.by.clone());
        format!(
            "revoked{}: free once its holder has fenced its command, or its etcd lease {} expired",
            by.map(|b| format!(" by {b}")).unwrap_or_default(),
            lease.lease_id
        )
    } else {
        format!("etcd lease {} kept alive", lease.lease_id)
    };
    if ours {
        same_host(
            &mut v,
            lock,
            &lease,
            me,
            "its etcd lease {} ends within its TTL",
        );
    }
    v.lease = Some(lease);
    v
}

/// The verdict on a lock nobody owns.
fn free(lock: &EtcdLock, clock: &dyn Clock) -> Verdict {
    Verdict {
        path: lock.url.clone(),
        state: State::Free,
        reason: format!("no key under {}", lock.prefix()),
        lease: None,
        same_host: false,
        heartbeat_age: None,
        remnants: Vec::new(),
        unchecked: None,
        judged_at: clock.wall(),
        queue_ahead: 0,
        queue: Vec::new(),
        behind: None,
        holders: Vec::new(),
        server_lease: None,
    }
}

/// A leasehold holder's record `lease`: on this host (same boot and pid namespace) and
/// verifiably dead (pid and start time), `v` becomes stale, with what its job left alive in its
/// process group judged by the environment leasehold gave it (`judge::note_leftovers`, as the
/// file store's). `then` says what becomes of its etcd lease (`{}`: the lease id).
fn same_host(v: &mut Verdict, lock: &EtcdLock, lease: &Lease, me: &Identity, then: &str) {
    let h = &lease.holder;
    v.same_host = me.same_host_as(&h.host, &h.boot_id, h.pid_ns);
    if v.same_host
        && let Liveness::Dead(why) = process::liveness(h.pid, h.pid_start)
    {
        v.state = State::Stale;
        v.reason = format!(
            "{why} (pid {}); {}",
            h.pid,
            then.replace("{}", &lease.lease_id)
        );
        judge::note_leftovers(v, lease, &judge::Proc, lock);
    }
}

/// A job record ([`EtcdLock::job_key`]) whose contender has no key in line any more: its etcd
/// lease expired or was revoked while the record stayed (it died, was frozen, or is between
/// giving up its place and forgetting its record).
pub(crate) struct DeadJob {
    /// The record's key, and its mod revision: it is forgotten only while it is the one read.
    pub key: Vec<u8>,
    pub mod_rev: i64,
    pub lease: Lease,
}

/// The records among `jobs` (read under [`EtcdLock::jobs_prefix`]) whose contender has no key
/// in `line` (every key under `NAME/`, matched by its etcd lease), other than `our_id`'s. A
/// record that is not leasehold's, or names another lease than its key, is passed over.
pub(crate) fn dead_jobs(
    lock: &EtcdLock,
    jobs: &[KeyValue],
    line: &[KeyValue],
    our_id: i64,
) -> Vec<DeadJob> {
    let prefix = lock.jobs_prefix();
    jobs.iter()
        .filter_map(|kv| {
            let id = kv.key_str().ok()?.strip_prefix(&prefix)?;
            let id = i64::from_str_radix(id, 16).ok()?;
            if id == our_id || line.iter().any(|k| k.lease() == id) {
                return None;
            }
            let Parsed::Lease(mut lease) = Lease::parse(kv.value()) else {
                return None;
            };
            if lease.token == 0 {
                // Written at join, in the transaction that created its key: the same revision.
                lease.token = kv.create_revision().max(0) as u64;
            }
            (u128::from_str_radix(&lease.lease_id, 16).ok() == Some(id as u128)).then(|| DeadJob {
                key: kv.key().to_vec(),
                mod_rev: kv.mod_revision(),
                lease: *lease,
            })
        })
        .collect()
}

/// At a takeover: the verdict on a contender whose etcd lease is gone but whose job record
/// stayed. On this host (same boot and pid namespace) and verifiably dead, it is stale, with
/// the remnants of its job to stop before our command may start; alive there, it is hung (a
/// frozen holder cannot fence: its command's group, verified, is stopped as the file store
/// stops a hung holder's; a contender that only waited has no process carrying its lease id,
/// so nothing of it is). On another host, nothing of it can be reached.
pub(crate) fn dead_job(
    lock: &EtcdLock,
    lease: &Lease,
    me: &Identity,
    clock: &dyn Clock,
) -> Verdict {
    let mut v = free(lock, clock);
    v.state = State::Held;
    v.reason = format!("etcd lease {} is gone", lease.lease_id);
    same_host(&mut v, lock, lease, me, "its etcd lease {} is gone");
    if v.same_host && v.state == State::Held {
        v.state = State::Hung;
        v.reason = format!(
            "pid {} lives but its etcd lease {} is gone (frozen?)",
            lease.holder.pid, lease.lease_id
        );
    }
    v.lease = Some(lease.clone());
    v
}

/// The waiters, in order, from the keys after the owner's.
pub(crate) fn waiting(kvs: &[KeyValue]) -> Vec<Waiting> {
    kvs.iter()
        .skip(1)
        .map(|kv| {
            let (l, ours) = record(kv);
            let user = if ours {
                l.holder.user
            } else {
                format!("etcdctl lock waiter, lease {:x}", kv.lease())
            };
            Waiting {
                seq: l.token,
                pid: l.holder.pid,
                host: l.holder.host,
                user,
                since: l.acquired_at,
                command: l.holder.command,
                beat: 0,
            }
        })
        .collect()
}

/// Every key under the lock's prefix, in line order.
fn line(conn: &Conn) -> Result<Vec<KeyValue>> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let prefix = conn.lock.prefix();
    let mut r = conn.run("read the lock's keys", |mut c| {
        let (prefix, opts) = (prefix.clone(), opts.clone());
        async move { c.get(prefix, Some(opts)).await }
    })?;
    Ok(r.take_kvs())
}

/// `status` of an etcd lock.
pub(crate) fn status(path: &Path, me: &Identity, clock: &dyn Clock) -> Result<Verdict> {
    let conn = Conn::connect(EtcdLock::parse(path)?)?;
    let kvs = line(&conn)?;
    if let Some(v) = super::shared::status(&conn, &kvs, me, clock)? {
        return Ok(v);
    }
    let mut v = verdict(&conn.lock, kvs.first(), me, clock);
    v.queue = waiting(&kvs);
    super::ending::annotate(&conn, &mut v, kvs.first());
    if let Some(kv) = kvs.first() {
        // How long the cluster keeps the owner's key without another keepalive: its word, in
        // place of a heartbeat this host would have to watch move.
        let id = kv.lease();
        let t = conn.run("read the owner's lease", |mut c| async move {
            c.lease_time_to_live(id, None).await
        })?;
        v.server_lease = Some(ServerLease {
            lease: kv.lease(),
            remaining_s: t.ttl(),
            granted_s: t.granted_ttl(),
        });
    }
    Ok(v)
}

/// `break` of an etcd lock (see the module's comment for what each case does).
pub(crate) fn break_lease(path: &Path, mode: BreakMode) -> Result<Broken> {
    let conn = Conn::connect(EtcdLock::parse(path)?)?;
    let kvs = line(&conn)?;
    if let Some(b) = super::shared::break_holders(&conn, &kvs, &mode)? {
        return Ok(b);
    }
    break_key(&conn, kvs.first(), mode)
}

/// `break` of the holder whose key is `kv`: the owner, or one of a shared lock's holders.
pub(crate) fn break_key(conn: &Conn, kv: Option<&KeyValue>, mode: BreakMode) -> Result<Broken> {
    let me = Identity::current();
    let clock = crate::clock::SystemClock;
    let v = verdict(&conn.lock, kv, &me, &clock);
    let refuse = |why: String| Error::Refused {
        path: conn.lock.url.clone(),
        why,
    };
    let (Some(kv), Some(lease)) = (kv, v.lease.clone()) else {
        return Err(refuse(format!("nothing to break: {v}")));
    };
    permitted(&v, &lease, kv, &mode).map_err(refuse)?;
    let ttl = Duration::from_millis(lease.ttl_ms);
    let mut out = Broken {
        verdict: v.clone(),
        was_live: v.state == State::Held,
        stopped: 0,
        written: LeaseState::Released,
        frees: Frees::Now,
        forged: None,
        unchecked: None,
        // Not looked for on an etcd lock (its script is usually on another host).
        at_terminal: None,
        already_revoked: lease.state == LeaseState::Revoked,
        more: Vec::new(),
    };
    if v.state == State::Stale {
        // Its holder is verifiably gone: stop what is left of its job (verified by the
        // environment leasehold gave it), then free the key at once.
        out.stopped = takeover::stop_old_job(&v, &conn.lock)
            .map_err(|why| refuse(format!("cannot stop the old job ({v}): {why}")))?;
        let ended = Ending {
            at: format_rfc3339(clock.wall()),
            how: format!("broken: {}", v.reason),
            by: Some(breaker(&me)),
        };
        super::ending::broken(conn, kv, &lease, &ended, false);
        conn.revoke("revoke the lease", CALL_TIMEOUT, kv.lease())?;
        return Ok(out);
    }
    out.written = LeaseState::Revoked;
    // Its holder fences at its next renewal and then revokes its etcd lease; a holder that
    // cannot renew any more loses the lease on the cluster within its TTL.
    out.frees = Frees::AfterTtl { ttl };
    if out.already_revoked {
        return Ok(out);
    }
    mark_revoked(conn, kv, lease, &v, &mode, &me, &clock).map_err(|e| match e {
        Some(e) => e,
        None => refuse(format!(
            "the lease changed while breaking it ({v}); nothing broken, look again"
        )),
    })?;
    Ok(out)
}

/// Whether `mode` lets the operator break the owner `kv` judged `v`: why not, if it does not.
fn permitted(
    v: &Verdict,
    lease: &Lease,
    kv: &KeyValue,
    mode: &BreakMode,
) -> std::result::Result<(), String> {
    match mode {
        BreakMode::Stale if v.state != State::Stale => {
            return Err(format!(
                "refusing to break a live lease: {v}; break it by its lease id {}, or by force",
                lease.lease_id
            ));
        }
        BreakMode::LeaseId(id) if u128::from_str_radix(id, 16).ok() != Some(kv.lease() as u128) => {
            return Err(format!(
                "the lease id is {}, not {id}: the lease changed hands; nothing broken",
                lease.lease_id
            ));
        }
        _ => {}
    }
    if lease.holder.pid == 0 {
        return Err(format!(
            "{v}: an etcdctl lock holder cannot be fenced, so leasehold will not free its lock; \
             once its command has stopped, `etcdctl lease revoke {:x}` frees it",
            kv.lease()
        ));
    }
    Ok(())
}

/// Replaces the owner's record in place by the same record marked revoked, keeping its key,
/// create revision and lease (`Err(None)`: the record changed since it was judged).
fn mark_revoked(
    conn: &Conn,
    kv: &KeyValue,
    lease: Lease,
    v: &Verdict,
    mode: &BreakMode,
    me: &Identity,
    clock: &dyn Clock,
) -> std::result::Result<(), Option<Error>> {
    let how = match mode {
        BreakMode::LeaseId(_) => "revoked by lease id",
        _ => "revoked by force",
    };
    let mut rec = lease;
    rec.state = LeaseState::Revoked;
    rec.ended = Some(Ending {
        at: format_rfc3339(clock.wall()),
        how: format!("{how}: {}", v.reason),
        by: Some(breaker(me)),
    });
    // In place, only over the record judged: the key, its create revision and its etcd lease
    // stay, so the line does not move until the holder fences and revokes, or the lease ends.
    let key = kv.key().to_vec();
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            kv.mod_revision(),
        )])
        .and_then([TxnOp::put(
            key,
            rec.to_bytes(),
            Some(PutOptions::new().with_ignore_lease()),
        )]);
    let r = conn
        .txn("mark the lease revoked", CALL_TIMEOUT, txn)
        .map_err(Some)?;
    if !r.succeeded() {
        return Err(None);
    }
    if let Some(ended) = &rec.ended {
        super::ending::broken(conn, kv, &rec, ended, true);
    }
    Ok(())
}

/// Who breaks: `user@host pid N`.
fn breaker(me: &Identity) -> String {
    format!("{}@{} pid {}", me.user, me.host, std::process::id())
}
