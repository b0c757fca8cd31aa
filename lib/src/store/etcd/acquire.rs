//! Taking a lease on etcd: etcd's own lock recipe, with leasehold's record as the key's value.
//!
//! Owns: one acquisition — grant an etcd lease (TTL rounded up to whole seconds), put our key
//! `<prefix><lease id in hex>` with it (`NAME/<id>` for a name without `/` or `%`; our holder
//! record as its value), and wait until no key under the prefix has a lower create revision: watching only the key just before ours (so the
//! line is FIFO and a release wakes one waiter), keeping our lease alive every heartbeat while
//! we wait — or, for `--shared` and `--slots N`, until `shared::place`'s rule lets us hold. The one-shot caller (`-n`) and a caller whose deadline passes revoke their lease,
//! which deletes their key. The guard starts from the start of the last keepalive answered
//! before we became first (the server counts our TTL from later). A record that names our
//! command's process group is also kept, from the moment we join, as our job record (outside
//! the line, without a lease); once first, and before the guard starts, what a dead or frozen
//! same-host contender's job left in its process group is stopped (verified) and its job record
//! forgotten, as the file store does at a takeover — all read in the same look that finds us
//! first, so a hand-over costs one read after the wake-up. A cluster no endpoint of which can
//! serve us is asked again with backoff until the deadline (then: the lock could not be had),
//! and refused at once for the one-shot caller (store unavailable).
//! Must never: start a guard on a key that is not first; start it on a lease whose last
//! keepalive was not answered with a live TTL; leave a key behind when giving up (it would
//! hold up everyone behind it until its TTL).

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::WatchOptions;
use etcd_client::{Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions};
use etcd_client::{Txn, TxnOp, TxnOpResponse, WatchFilterType};

use super::holding::EtcdHolding;
use super::look::{DeadJob, dead_job, dead_jobs, first, verdict};
use super::shared::{self, Place, Watch};
use super::{CALL_TIMEOUT, Conn, EtcdLock};
use crate::boottime::BootInstant;
use crate::builder::LeaseBuilder;
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::guard::{LeaseGuard, Start};
use crate::identity::Identity;
use crate::slots::Want;
use crate::takeover;
use crate::timing::Timing;
use crate::verdict::Verdict;

/// What one contender is while it waits: its lease, key and place.
struct Contender {
    id: i64,
    key: String,
    /// Our key's create revision: our place in line, and our token once first.
    rev: i64,
    /// When the last keepalive answered with a live TTL was sent.
    /// When the last answered keepalive was sent (CLOCK_BOOTTIME, as every renew deadline).
    last_ok: BootInstant,
}

/// How a look at the line came out.
enum Look {
    /// Nobody is ahead of us; the job records of contenders no longer in line.
    First(Vec<DeadJob>),
    /// Our key is gone (deleted by hand, or our lease expired while we could not renew it).
    Gone,
    /// What we wait to see deleted, the owner, how many wait ahead, and the revision read at.
    Behind(Watch, Option<Box<KeyValue>>, usize, i64),
}

/// How a wait ended.
enum Woken {
    /// The key ahead of us was deleted (or the watch broke: look again).
    Look,
    Deadline,
    /// Our own lease is gone.
    LeaseLost,
    /// The caller's [`Cancel`](crate::Cancel) handle was cancelled.
    Cancelled,
}

/// Resolves once `cancel` is cancelled (never without one). Looked at every 50 ms: the eventfd
/// is not registered with the runtime, which has no I/O driver here.
async fn cancelled(cancel: Option<&crate::cancel::Cancel>) {
    match cancel {
        None => std::future::pending().await,
        Some(c) => {
            while !c.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Takes the lease on the etcd lock the builder names: at once or not at all (`one_shot`), or
/// waiting until `deadline` (for ever with `None`).
pub(crate) fn acquire(
    s: &LeaseBuilder,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Result<LeaseGuard> {
    let timing = s.timing()?;
    // `--shared` and `--slots N`: the same line, another rule for who holds (`shared.rs`).
    s.want.validate()?;
    let me = s.identity.clone().unwrap_or_else(Identity::current);
    let conn = Arc::new(Conn::connect(EtcdLock::parse(&s.path)?)?);
    let started = Instant::now();
    let mut reported: Option<i64> = None;
    let mut said_unavailable = false;
    let mut backoff = Backoff::new();
    loop {
        let mut c = match join(s, &conn, &me, &timing, deadline, one_shot) {
            Ok(c) => c,
            // The wait ran out with the cluster unable to serve us: the lock could not be had.
            Err(e) => {
                return Err(match super::unavailable(&e) {
                    Some(why) if !one_shot => {
                        timeout(&conn, started, cluster_verdict(s, &conn, &me, why))
                    }
                    _ => e,
                });
            }
        };
        loop {
            let (ahead, owner, n, at) = match look(&conn, &c, s.want, call_limit(deadline)) {
                Ok(Look::First(dead)) => {
                    match stop_remnants(s, &conn, &mut c, dead, deadline, one_shot) {
                        Ok(true) => {
                            let id = c.id;
                            return hold(s, Arc::clone(&conn), c, timing, &me).inspect_err(|_| {
                                // Never leave our key holding up the line behind us.
                                let _ = conn.revoke("revoke our lease", CALL_TIMEOUT, id);
                            });
                        }
                        Ok(false) => break,
                        Err(e) => {
                            give_up(&conn, &c);
                            return Err(e);
                        }
                    }
                }
                Ok(Look::Gone) => break,
                Ok(Look::Behind(a, o, n, at)) => (a, o, n, at),
                // In line, a cluster that cannot serve us for now (an election) keeps our place:
                // look again; should it last past our TTL, our key is gone and we join again.
                Err(e)
                    if !one_shot
                        && super::unavailable(&e).is_some()
                        && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    if !said_unavailable && let Some(why) = super::unavailable(&e) {
                        say_unavailable(s, &conn, &me, why, deadline);
                        said_unavailable = true;
                    }
                    backoff.pause(deadline);
                    continue;
                }
                Err(e) => {
                    // Never leave our key holding up the line behind us.
                    give_up(&conn, &c);
                    return Err(match super::unavailable(&e) {
                        Some(why) if !one_shot => {
                            timeout(&conn, started, cluster_verdict(s, &conn, &me, why))
                        }
                        _ => e,
                    });
                }
            };
            backoff = Backoff::new();
            let mut v = verdict(&conn.lock, owner.as_deref(), &me, s.clock.as_ref());
            v.queue_ahead = n;
            v.behind = shared::behind(s.want, n);
            if one_shot {
                give_up(&conn, &c);
                return Err(Error::WouldBlock {
                    path: conn.lock.url.clone(),
                    verdict: Box::new(v),
                });
            }
            let rev = owner.as_ref().map_or(0, |o| o.create_revision());
            if reported != Some(rev)
                && let Some(cb) = &s.on_wait
            {
                (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(&v);
                reported = Some(rev);
            }
            let cancel = s.cancel.as_ref();
            match wait(
                &conn,
                &mut c,
                &ahead,
                at,
                timing.heartbeat,
                deadline,
                cancel,
            ) {
                Woken::Look => {}
                Woken::LeaseLost => break,
                Woken::Cancelled => {
                    // Our key leaves the line at once (the lease revoked), as with a timeout.
                    give_up(&conn, &c);
                    return Err(Error::Cancelled {
                        path: conn.lock.url.clone(),
                        waited: started.elapsed(),
                    });
                }
                Woken::Deadline => {
                    give_up(&conn, &c);
                    return Err(timeout(&conn, started, v));
                }
            }
        }
        // Our place is gone: join the line again, at its end.
        give_up(&conn, &c);
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let v = verdict(&conn.lock, None, &me, s.clock.as_ref());
            return Err(timeout(&conn, started, v));
        }
    }
}

fn timeout(conn: &Conn, started: Instant, v: Verdict) -> Error {
    Error::Timeout {
        path: conn.lock.url.clone(),
        waited: started.elapsed(),
        verdict: Box::new(v),
    }
}

/// Grants our etcd lease and puts our key, with our record, in line. A lease that expired
/// before our key could be put with it (a cluster too slow to answer within its TTL, or a
/// leader that lost it) is granted again, twice at most. A cluster that cannot serve us for now
/// (no member reachable; no leader: an election, a cluster just resumed or without a quorum; no
/// answer in time) refuses or drops every write: unless we may not wait (`one_shot`), we say so
/// once and try again, with backoff, until `deadline`, as a contender queued behind a holder
/// would wait; the error after it is still [`super::unavailable`].
fn join(
    s: &LeaseBuilder,
    conn: &Conn,
    me: &Identity,
    timing: &Timing,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Result<Contender> {
    let mut tries = 0;
    let mut said = false;
    let mut backoff = Backoff::new();
    loop {
        let e = match join_once(s, conn, me, timing, call_limit(deadline)) {
            Err(e) if tries < 2 && e.to_string().contains("requested lease not found") => {
                tries += 1;
                continue;
            }
            Err(e) if !one_shot && deadline.is_none_or(|d| Instant::now() < d) => e,
            r => return r,
        };
        let Some(why) = super::unavailable(&e) else {
            return Err(e);
        };
        if !said {
            say_unavailable(s, conn, me, why, deadline);
            said = true;
        }
        backoff.pause(deadline);
    }
}

/// How long one call on the way to the lock may take: [`CALL_TIMEOUT`], and no longer than the
/// caller's deadline leaves (at least 100 ms), so that `-w` is kept with a member that hangs.
fn call_limit(deadline: Option<Instant>) -> Duration {
    deadline.map_or(CALL_TIMEOUT, |d| {
        let left = d.saturating_duration_since(Instant::now());
        CALL_TIMEOUT.min(left).max(Duration::from_millis(100))
    })
}

/// The pause between two tries at a cluster that cannot serve us: 100 ms, doubling up to 1 s,
/// never past the caller's deadline.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MOST: Duration = Duration::from_secs(1);

    fn new() -> Backoff {
        Backoff(Backoff::FIRST)
    }

    fn pause(&mut self, deadline: Option<Instant>) {
        let left = deadline.map_or(self.0, |d| d.saturating_duration_since(Instant::now()));
        std::thread::sleep(self.0.min(left));
        self.0 = (self.0 * 2).min(Backoff::MOST);
    }
}

/// The verdict of a contender waiting for the cluster itself: nothing about the lease could be
/// read (no reason, no lease); `why` names each endpoint tried and its cause.
fn cluster_verdict(s: &LeaseBuilder, conn: &Conn, me: &Identity, why: &str) -> Verdict {
    let mut v = verdict(&conn.lock, None, me, s.clock.as_ref());
    v.reason.clear();
    v.behind = Some(format!("the etcd cluster, which cannot serve us ({why})"));
    v
}

/// Tells the waiting caller that we wait for the cluster itself (see [`cluster_verdict`]),
/// until when, and how often we ask.
fn say_unavailable(
    s: &LeaseBuilder,
    conn: &Conn,
    me: &Identity,
    why: &str,
    deadline: Option<Instant>,
) {
    if let Some(cb) = &s.on_wait {
        let mut v = cluster_verdict(s, conn, me, why);
        let until = match deadline {
            Some(_) => "until the wait runs out",
            None => "for ever: no --wait limit",
        };
        if let Some(b) = v.behind.as_mut() {
            b.push_str(&format!(
                ", asking again with backoff ({:?} up to {:?}) {until}",
                Backoff::FIRST,
                Backoff::MOST
            ));
        }
        (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(&v);
    }
}

/// One [`join`]: a lease granted, our key put with it.
/// Each call at most `within`.
fn join_once(
    s: &LeaseBuilder,
    conn: &Conn,
    me: &Identity,
    timing: &Timing,
    within: Duration,
) -> Result<Contender> {
    let secs = timing.ttl.as_secs_f64().ceil().max(1.0) as i64;
    let sent = BootInstant::now();
    let g = conn.call("grant a lease", within, |mut c| async move {
        c.lease_grant(secs, None).await
    })?;
    let id = g.id();
    let key = super::shared::key(&conn.lock, id, s.want);
    let now = format_rfc3339(s.clock.wall());
    let mut lease = s.new_lease(me, timing, &now);
    lease.lease_id = format!("{id:032x}");
    let bytes = lease.to_bytes();
    let put = |job: bool| {
        let mut ops = vec![TxnOp::put(
            key.clone(),
            bytes.clone(),
            Some(PutOptions::new().with_lease(id)),
        )];
        if job {
            // Our job record: the process group our command will run in, kept past our key.
            // Not the command's pid: until the lease is ours it waits at its gate, not yet
            // this lease's job, and a frozen contender is judged by its group's members alone.
            let mut rec = lease.clone();
            (rec.holder.child_pid, rec.holder.child_start) = (None, None);
            ops.push(TxnOp::put(conn.lock.job_key(id), rec.to_bytes(), None));
        }
        Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(ops)
            .or_else([TxnOp::get(key.clone(), None)])
    };
    let job = lease.holder.pgid.is_some() && conn.keeps_jobs();
    let r = match conn.txn("put our key", within, put(job)) {
        // A user allowed only the lock's prefix: in line without a job record.
        Err(e) if job && conn.jobs_denied(&e) => conn.txn("put our key", within, put(false)),
        r => r,
    }
    .inspect_err(|_| {
        // A put that timed out may still land: leaving takes its key and record out of the
        // line at once, instead of one TTL later (best effort: the lease ends by itself, and
        // a record without a process carrying its lease id stops nothing).
        let c = Contender {
            id,
            key: key.clone(),
            rev: 0,
            last_ok: sent,
        };
        give_up(conn, &c);
    })?;
    let rev = if r.succeeded() {
        r.header().map_or(0, |h| h.revision())
    } else {
        got(&r.op_responses(), 0).map_or(0, |kv| kv.create_revision())
    };
    Ok(Contender {
        id,
        key,
        rev,
        last_ok: sent,
    })
}

/// The first key of the `i`th get in a transaction's answers.
fn got(ops: &[TxnOpResponse], i: usize) -> Option<KeyValue> {
    match ops.get(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
        _ => None,
    }
}

/// Where we stand: one read of our key, the owner, every key in line (keys only) and the job
/// records; who holds and what we wait for is [`shared::place`]'s rule for `want` (for an
/// exclusive contender, etcd's recipe: nobody ahead, else the key just before ours).
fn look(conn: &Conn, c: &Contender, want: Want, within: Duration) -> Result<Look> {
    let prefix = conn.lock.prefix();
    let txn = |jobs: bool| {
        let mut ops = vec![
            TxnOp::get(c.key.clone(), None),
            TxnOp::get(prefix.clone(), Some(first())),
            TxnOp::get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        ];
        if jobs {
            let opts = GetOptions::new().with_prefix();
            ops.push(TxnOp::get(conn.lock.jobs_prefix(), Some(opts)));
        }
        Txn::new().and_then(ops)
    };
    let jobs = conn.keeps_jobs();
    let r = match conn.txn("look at the line", within, txn(jobs)) {
        Err(e) if jobs && conn.jobs_denied(&e) => {
            conn.txn("look at the line", within, txn(false))?
        }
        r => r?,
    };
    let at = r.header().map_or(0, |h| h.revision());
    let ops = r.op_responses();
    if got(&ops, 0).is_none_or(|kv| kv.create_revision() != c.rev) {
        return Ok(Look::Gone);
    }
    let all = |i: usize| match ops.get(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs(),
        _ => &[],
    };
    let (watch, ahead) = match shared::place(want, &prefix, c.rev, all(2)) {
        Place::Holds => return Ok(Look::First(dead_jobs(&conn.lock, all(3), all(2), c.id))),
        Place::Mismatch(held) => return Err(shared::mismatch(&conn.lock, want, held)),
        Place::Waits { watch, ahead } => (watch, ahead),
    };
    // Counted here: etcd's count ignores a create-revision filter. The owner is not "ahead".
    let count = ahead.max(1) - 1;
    let owner = got(&ops, 1).map(Box::new);
    Ok(Look::Behind(watch, owner, count, at))
}

/// Waits for `ahead` to be deleted after revision `at` (a key, or any key under the prefix),
/// keeping our lease alive every `every`, until `deadline`.
fn wait(
    conn: &Conn,
    c: &mut Contender,
    ahead: &Watch,
    at: i64,
    every: Duration,
    deadline: Option<Instant>,
    cancel: Option<&crate::cancel::Cancel>,
) -> Woken {
    let (ahead, prefix) = match ahead {
        Watch::Key(k) => (k.clone(), false),
        Watch::Prefix => (conn.lock.prefix().into_bytes(), true),
    };
    let id = c.id;
    let last_ok = &mut c.last_ok;
    conn.block_on(async move {
        let mut opts = WatchOptions::new()
            .with_start_revision(at + 1)
            .with_filters([WatchFilterType::NoPut]);
        if prefix {
            opts = opts.with_prefix();
        }
        let until = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(until);
        // Both streams on whichever member answers (the look before failed over already).
        let watch = conn.failover("watch the key ahead", every, |c| {
            let (ahead, opts) = (ahead.clone(), opts.clone());
            async move { c.watch_client().watch(ahead, Some(opts)).await }
        });
        let Ok(mut ws) = watch.await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Woken::Look;
        };
        let kept = conn.failover("renew our lease", every, |c| async move {
            c.lease_client().keep_alive(id).await
        });
        let Ok((mut keeper, mut kas)) = kept.await else {
            return Woken::Look;
        };
        let mut tick = tokio::time::interval_at((Instant::now() + every).into(), every);
        loop {
            tokio::select! {
                m = ws.message() => match m {
                    Ok(Some(r)) if r.canceled() => return Woken::Look,
                    Ok(Some(r)) => {
                        if r.events().iter().any(|e| e.event_type() == EventType::Delete) {
                            return Woken::Look;
                        }
                    }
                    _ => return Woken::Look,
                },
                _ = tick.tick() => {
                    let sent = BootInstant::now();
                    let renewed = async {
                        keeper.keep_alive().await?;
                        kas.message().await
                    };
                    match tokio::time::timeout(every, renewed).await {
                        Ok(Ok(Some(r))) if r.ttl() > 0 => *last_ok = sent,
                        Ok(Ok(Some(_))) => return Woken::LeaseLost,
                        _ => return Woken::Look,
                    }
                }
                _ = &mut until => return Woken::Deadline,
                _ = cancelled(cancel) => return Woken::Cancelled,
            }
        }
    })
}

/// First in line, before our command may start: for each job record whose contender has left
/// the line (`dead`, read in the look that found us first), what that job left in its process
/// group on this host is stopped — a dead holder's leftovers, a frozen holder's command — each
/// process verified by the environment leasehold gave it (the file store's rule,
/// `takeover::stop_old_job`), and the record is forgotten. Having stopped something, a
/// keepalive answered with a live TTL proves our key still first and restarts the guard's count
/// (`false`: our lease is gone, join again). While a process of an old job cannot be checked, a
/// one-shot caller refuses and a waiting one keeps its place (and its lease) until it is gone
/// or the deadline passes.
fn stop_remnants(
    s: &LeaseBuilder,
    conn: &Conn,
    c: &mut Contender,
    mut dead: Vec<DeadJob>,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Result<bool> {
    let every = s.timing()?.heartbeat;
    let me = s.identity.clone().unwrap_or_else(Identity::current);
    let mut reported = false;
    loop {
        let mut stopped = 0;
        let mut blocked = None;
        for d in &dead {
            let v = dead_job(&conn.lock, &d.lease, &me, s.clock.as_ref());
            match takeover::stop_old_job(&v, &conn.lock) {
                Ok(n) => {
                    stopped += n;
                    forget(conn, d);
                }
                Err(why) => blocked = Some((v, why)),
            }
        }
        let Some((mut v, why)) = blocked else {
            return if stopped > 0 {
                keep_alive(conn, c)
            } else {
                Ok(true)
            };
        };
        let refused = |v: &Verdict| Error::Refused {
            path: conn.lock.url.clone(),
            why: format!("not taking over ({v}): {why}"),
        };
        if one_shot {
            return Err(refused(&v));
        }
        v.reason = format!("{}; not taking over: {why}", v.reason);
        if !reported && let Some(cb) = &s.on_wait {
            (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(&v);
            reported = true;
        }
        // Keep our place, and our lease alive, while the old process lives.
        let until = Instant::now() + every;
        if deadline.is_some_and(|d| d <= until) {
            return Err(Error::Timeout {
                path: conn.lock.url.clone(),
                waited: Duration::ZERO,
                verdict: Box::new(v),
            });
        }
        conn.block_on(async move { tokio::time::sleep_until(until.into()).await });
        if !keep_alive(conn, c)? {
            return Ok(false);
        }
        dead = match look(conn, c, s.want, CALL_TIMEOUT)? {
            Look::First(d) => d,
            _ => return Ok(false),
        };
    }
}

/// Forgets a dead contender's job record, while it is the one read (best effort: left behind,
/// it is looked at again by the next owner).
fn forget(conn: &Conn, d: &DeadJob) {
    let txn = Txn::new()
        .when([Compare::mod_revision(
            d.key.clone(),
            CompareOp::Equal,
            d.mod_rev,
        )])
        .and_then([TxnOp::delete(d.key.clone(), None)]);
    let _ = conn.txn("forget a gone contender's job record", CALL_TIMEOUT, txn);
}

/// One keepalive of our lease: `true` when answered with a live TTL (and then the guard counts
/// from when it was sent), `false` when our lease is gone.
fn keep_alive(conn: &Conn, c: &mut Contender) -> Result<bool> {
    let sent = BootInstant::now();
    let id = c.id;
    // Opening a keepalive stream sends one keepalive and fails if it is answered with TTL 0.
    let live = conn.run("renew our lease", |c| async move {
        match c.lease_client().keep_alive(id).await {
            Ok(_) => Ok(true),
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(e) => Err(e),
        }
    })?;
    if live {
        c.last_ok = sent;
    }
    Ok(live)
}

/// Gives up our place: deletes our key and our job record in one transaction (so nobody finds
/// the record of a contender that left the line alive), then revokes our lease (best effort:
/// otherwise the key goes when the lease expires, and the record is forgotten by the next
/// owner).
fn give_up(conn: &Conn, c: &Contender) {
    if conn.keeps_jobs() {
        let txn = Txn::new().and_then([
            TxnOp::delete(c.key.clone(), None),
            TxnOp::delete(conn.lock.job_key(c.id), None),
        ]);
        let _ = conn.txn("leave the line", CALL_TIMEOUT, txn);
    }
    let _ = conn.revoke("revoke our lease", CALL_TIMEOUT, c.id);
}

/// First in line: the lease is ours. The guard counts from the last keepalive answered.
fn hold(
    s: &LeaseBuilder,
    conn: Arc<Conn>,
    c: Contender,
    timing: Timing,
    me: &Identity,
) -> Result<LeaseGuard> {
    let now = format_rfc3339(s.clock.wall());
    let mut lease = s.new_lease(me, &timing, &now);
    lease.lease_id = format!("{:032x}", c.id);
    lease.token = c.rev.max(0) as u64;
    // How the holding before ours ended, and our start, in the lock's history (`ending.rs`) —
    // an exclusive holding's only: shared and counted holders hold together, and the history
    // names one holding (a second shared holder would record the first as died).
    if s.want == Want::Exclusive {
        super::ending::start(&conn, &c.key, c.rev, &mut lease, s.max_time)?;
    } else {
        conn.without_history();
    }
    let bytes = lease.to_bytes();
    let path = conn.lock.url.clone();
    let holding = EtcdHolding::new(conn, c.id, c.key, c.rev, timing.heartbeat);
    LeaseGuard::start(Start {
        path,
        timing,
        clock: Arc::clone(&s.clock),
        lease,
        bytes,
        started: c.last_ok,
        on_lost: s.on_lost.clone(),
        on_serve: s.on_serve.clone(),
        broke: None,
        holding,
    })
}
