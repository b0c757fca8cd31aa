//! `status` and `break` of an S3 lock.
//!
//! Owns: one read of the lock's object judged as the file store judges LOCK (a same-host holder
//! by its processes; any other by observation, which a one-shot look cannot make: it is shown
//! held, "heartbeat being watched"), and the operator's break: a stale lease is replaced by
//! itself marked released (after what its job left on this host is stopped, verified), a live
//! one by itself marked revoked — its holder fences at its next renewal and then releases it;
//! each by a PUT with `If-Match` on the ETag judged.
//! Must never: DELETE the object; write over an object other than the one judged; signal a
//! process that /proc does not verify as the job of this lock and lease.

use std::path::Path;
use std::time::Duration;

use super::acquire::S3Store;
use super::{CALL_TIMEOUT, Client, Put, S3Lock};
use crate::clock::{Clock, SystemClock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsio::LockContent;
use crate::identity::Identity;
use crate::judge::Judge;
use crate::observe::Memory;
use crate::record::{Ending, LeaseState};
use crate::slots::Look;
use crate::status::outcome::{BreakMode, Broken, Frees};
use crate::takeover;
use crate::verdict::{State, Verdict};

fn judge(client: &Client, content: &LockContent, me: &Identity, clock: &dyn Clock) -> Verdict {
    let j = Judge {
        binding: &client.lock,
        me,
        clock,
        wall_skew: None,
        persist: false,
    };
    let mut v = j.judge(content, &mut Memory::default());
    if matches!(content, LockContent::Missing) {
        v.reason = "no lease yet (no object at this key)".into();
    }
    v
}

/// `leasehold status s3://BUCKET/KEY`: on a shared or counted lock, with every holder.
pub(crate) fn status(path: &Path, me: &Identity, clock: &dyn Clock) -> Result<Verdict> {
    let client = Client::new(S3Lock::parse(path)?);
    let object = client.object(CALL_TIMEOUT)?;
    let content = object.content(&client.lock.url, 0)?;
    let mut v = judge(&client, &content, me, clock);
    if let Some(m) = crate::slots::lock_mode(&content) {
        // The holders as this one read of the object shows them.
        let store = S3Store::new(client, Duration::from_secs(1));
        store.section_on(object);
        crate::status::holders::look(&store, m, &mut v, look(me, clock))?;
    }
    Ok(v)
}

/// How a look at the holders of a shared lock judges (observations in memory only).
fn look<'a>(me: &'a Identity, clock: &'a dyn Clock) -> Look<'a> {
    Look {
        me,
        clock,
        wall_skew: None,
        persist: false,
    }
}

/// `leasehold break s3://BUCKET/KEY`.
pub(crate) fn break_lease(path: &Path, mode: BreakMode) -> Result<Broken> {
    let client = Client::new(S3Lock::parse(path)?);
    let me = Identity::current();
    let clock = SystemClock;
    let object = client.object(CALL_TIMEOUT)?;
    let content = object.content(&client.lock.url, 0)?;
    let v = judge(&client, &content, &me, &clock);
    if let Some(m) = crate::slots::lock_mode(&content) {
        // A shared or counted lock: its holders are broken as a lock file's are, each record
        // replaced on the object as read here (`S3Store`'s section on it).
        let store = S3Store::new(client, Duration::from_secs(1));
        let section = store.section_on(object);
        let look = look(&me, &clock);
        return crate::status::holders::brk(&store, &section, m, &content, &v, &mode, look);
    }
    let refuse = |why: String| Error::Refused {
        path: client.lock.url.clone(),
        why,
    };
    let (LockContent::Lease(lease, _), Some(_), false) =
        (&content, &object.etag, v.state == State::Free)
    else {
        return Err(refuse(format!("nothing to break: {v}")));
    };
    crate::status::permitted(&v, lease, &mode).map_err(refuse)?;
    let was_live = matches!(v.state, State::Held | State::Hung);
    let ttl = Duration::from_millis(lease.ttl_ms);
    let mut out = Broken {
        verdict: v.clone(),
        was_live,
        stopped: 0,
        written: LeaseState::Released,
        frees: Frees::Now,
        forged: None,
        unchecked: None,
        at_terminal: None,
        already_revoked: false,
        more: Vec::new(),
    };
    let by = format!("{}@{} pid {}", me.user, me.host, std::process::id());
    let (state, how) = match v.state {
        // A hung same-host holder: its command stopped (verified) first, then released.
        State::Stale | State::Hung if v.same_host => {
            out.stopped = takeover::stop_old_job(&v, &client.lock).map_err(refuse)?;
            (LeaseState::Released, format!("broken: {}", v.reason))
        }
        State::Stale => (LeaseState::Released, format!("broken: {}", v.reason)),
        _ if lease.state == LeaseState::Revoked => {
            // Writing it again would restart every other host's TTL.
            out.written = LeaseState::Revoked;
            out.already_revoked = true;
            out.frees = frees(&v, ttl);
            return Ok(out);
        }
        _ => {
            out.written = LeaseState::Revoked;
            out.frees = frees(&v, ttl);
            (LeaseState::Revoked, "revoked".to_string())
        }
    };
    let mut rec = lease.as_ref().clone();
    rec.state = state;
    rec.damaged = false;
    rec.ended = Some(Ending {
        at: format_rfc3339(clock.wall()),
        how,
        by: Some(by),
    });
    let (body, nonce) = object.with(0, &rec.to_bytes());
    match client.put(&body, &object.cond(), CALL_TIMEOUT)? {
        Put::Done(_) => Ok(out),
        Put::Failed => Err(refuse(
            "the lock's object changed while it was being broken; nothing broken: look again"
                .into(),
        )),
        Put::Unknown(why) => match client.read(CALL_TIMEOUT)? {
            (_, _, n) if n == nonce => Ok(out),
            _ => Err(refuse(format!(
                "the break's write was not answered ({why}) and did not land; nothing broken"
            ))),
        },
    }
}

fn frees(v: &Verdict, ttl: Duration) -> Frees {
    if v.same_host {
        Frees::WhenGone { ttl }
    } else {
        Frees::AfterTtl { ttl }
    }
}
