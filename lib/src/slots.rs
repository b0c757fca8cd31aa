//! Shared leases and counted slots: a lock used with `--shared` or `--slots N` (PROTOCOL.md §13).
//!
//! Owns: what a contender wants (an exclusive lease, a shared one, one of N slots) and whether
//! that agrees with the setting the lock's holders use; the names of the holder files
//! (`.NAME.leasehold-slot-K`, each a complete lease of its own holder, with its own observation
//! file); reading and judging every holder of a lock ([`Holders`]); the record LOCK keeps for a
//! shared lock (format 2: a released record carrying the lock's [`Mode`]); and the nudge a
//! holder file's release gives LOCK so that the head waiter wakes.
//! Must never: count a holder file as free unless it holds no lease, a released one, or one
//! whose job was stopped (verified) under the mutex; write LOCK or a holder file outside the
//! mutex (renewals and a holder's own release aside); write LOCK over a live exclusive lease.

use std::time::{Duration, Instant};

use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsio::{self, LockContent};
use crate::identity::Identity;
use crate::judge::Judge;
use crate::mutex;
use crate::observe::Memory;
use crate::paths::{LockPaths, helper_name};
use crate::record::{Ending, Lease, LeaseState, MAX_WIDTH, Mode};
use crate::store::{Store, StuckPolicy};
use crate::takeover;
use crate::verdict::{State, Verdict};

/// What a contender asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// The whole lock (the default; on a shared lock, it excludes every shared holder).
    Exclusive,
    /// A shared lease: any number together, no exclusive holder.
    Shared,
    /// One of N slots: at most N holders together.
    Slots(u32),
}

impl Want {
    /// The setting as the command line spells it.
    pub(crate) fn setting(self) -> String {
        match self {
            Want::Exclusive => "a plain (exclusive) lock".into(),
            Want::Shared => "--shared".into(),
            Want::Slots(n) => format!("--slots {n}"),
        }
    }

    /// Refuses a number of slots that cannot work.
    pub(crate) fn validate(self) -> Result<()> {
        match self {
            Want::Slots(n) if n == 0 || n > MAX_WIDTH => Err(Error::Settings(format!(
                "--slots {n}: the number of slots must be between 1 and {MAX_WIDTH}"
            ))),
            _ => Ok(()),
        }
    }

    /// The slot limit this asks for, as [`Mode::slots`] records it.
    pub(crate) fn limit(self) -> Option<u32> {
        match self {
            Want::Slots(n) => Some(n),
            _ => None,
        }
    }

    /// The most holder files this may use.
    pub(crate) fn limit_or(self, max: u32) -> u32 {
        self.limit().unwrap_or(max)
    }
}

/// Whether an attempt that read `content` in LOCK goes the shared way: it asks for a shared
/// lease or a slot, or LOCK is a shared lock's record (format 2), or LOCK is missing or empty
/// (emptied by hand) while holder file 0 exists — its holders must be looked at before anyone
/// takes LOCK. A plain lock's plain contender (the common case: LOCK holds a format-1 record)
/// goes on as ever, without a look at any holder file.
pub(crate) fn involved<S: Store>(want: Want, content: &LockContent, store: &S) -> bool {
    want != Want::Exclusive
        || lock_mode(content).is_some()
        || (matches!(content, LockContent::Missing | LockContent::Empty)
            && !matches!(store.holder(0).read(), Ok(LockContent::Missing)))
}

/// The mode LOCK records, if it is a shared lock's record.
pub(crate) fn lock_mode(content: &LockContent) -> Option<Mode> {
    match content {
        LockContent::Lease(l, _) => l.mode,
        _ => None,
    }
}

/// The paths of holder file `k` of the lock at `lock`: the file itself and its observation
/// file; everything else (directory, mutex, temp files, queue) is LOCK's.
pub(crate) fn holder_paths(lock: &LockPaths, k: u32) -> LockPaths {
    let name = lock.lock_name().to_os_string();
    let uid = rustix::process::geteuid().as_raw();
    let mut p = lock.clone();
    p.lock = lock
        .dir
        .join(helper_name(&name, &format!(".leasehold-slot-{k}")));
    p.seen = lock.dir.join(helper_name(
        &name,
        &format!(".leasehold-slot-{k}-seen-{uid}"),
    ));
    p
}

/// One holder file of a shared lock, read and judged.
#[derive(Debug)]
pub(crate) struct Slot<S> {
    /// Its index.
    pub k: u32,
    /// Its store.
    pub store: S,
    /// What it held when read.
    pub content: LockContent,
    /// Its judgement (as a contender's, recording this host's observation).
    pub verdict: Verdict,
}

impl<S> Slot<S> {
    /// Whether a holder holds it (live, or stale/hung but not stopped yet).
    pub(crate) fn occupied(&self) -> bool {
        self.verdict.state != State::Free
    }
}

/// Who judges, and how (see `judge.rs`).
#[derive(Clone, Copy)]
pub(crate) struct Look<'a> {
    pub me: &'a Identity,
    pub clock: &'a dyn crate::clock::Clock,
    pub wall_skew: Option<Duration>,
    /// Whether observations are written down (a contender, or a look under the mutex).
    pub persist: bool,
}

/// Every holder file of a lock whose LOCK records `mode`, read and judged.
#[derive(Debug)]
pub(crate) struct Holders<S> {
    pub slots: Vec<Slot<S>>,
}

impl<S: Store> Holders<S> {
    /// Reads and judges holder files `0..mode.width` (none without a mode), with `mems` (one
    /// memory per file, grown as needed) remembering what this process saw of each.
    pub(crate) fn read(
        store: &S,
        mode: Option<Mode>,
        look: Look<'_>,
        mems: &mut Vec<Memory>,
    ) -> Result<Holders<S>> {
        // Without a mode (LOCK is plain, missing or emptied by hand), the holder files present
        // are counted: they are numbered from 0 without gaps, and never deleted. With one, the
        // files present past its width too (a width forged smaller must not make a contender
        // write over a live holder's file).
        let present = |from: u32| {
            (from..MAX_WIDTH)
                .find(|k| matches!(store.holder(*k).read(), Ok(LockContent::Missing)))
                .unwrap_or(MAX_WIDTH)
        };
        let width = present(mode.map_or(0, |m| m.width.min(MAX_WIDTH)));
        if mems.len() < width as usize {
            mems.resize_with(width as usize, Memory::default);
        }
        let mut slots = Vec::with_capacity(width as usize);
        for k in 0..width {
            let s = store.holder(k);
            let content = s.read()?;
            let mut judge: Judge<'_> = s.judge(look.me, look.clock);
            judge.wall_skew = look.wall_skew;
            judge.persist = look.persist;
            let verdict = judge.judge(&content, &mut mems[k as usize]);
            slots.push(Slot {
                k,
                store: s,
                content,
                verdict,
            });
        }
        Ok(Holders { slots })
    }

    /// How many holders hold a file.
    pub(crate) fn occupied(&self) -> usize {
        self.slots.iter().filter(|s| s.occupied()).count()
    }

    /// The verdicts of the files a holder holds (for `status` and wait lines).
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        self.slots
            .iter()
            .filter(|s| s.occupied())
            .map(|s| s.verdict.clone())
            .collect()
    }

    /// Inside the section: frees every holder file whose holder is dead (stale) — or hung, with
    /// `hung` — after stopping what is left of its job (verified), by writing a released record
    /// in its place (token kept, `ended` saying why and by whom); the other holders are not
    /// touched. A holder whose leftovers cannot be checked stays, with the reason in its
    /// verdict. Returns how many were freed.
    pub(crate) fn clean(
        &mut self,
        section: &S::Section,
        hung: bool,
        me: &Identity,
        clock: &dyn crate::clock::Clock,
    ) -> Result<usize> {
        let mut freed = 0;
        for s in &mut self.slots {
            let v = &mut s.verdict;
            let dead = v.state == State::Stale || (hung && v.state == State::Hung);
            let Some(lease) = v.lease.clone().filter(|_| dead) else {
                continue;
            };
            if let Err(why) = takeover::stop_old_job(v, s.store.binding()) {
                v.reason = format!("{}; not taking over: {why}", v.reason);
                continue;
            }
            let how = format!("broken: {}", v.reason);
            s.store.replace(section, &released(lease, how, me, clock))?;
            s.store.clean_after_crash();
            v.state = State::Free;
            freed += 1;
        }
        Ok(freed)
    }

    /// The greatest token any holder file records.
    pub(crate) fn max_token(&self) -> u64 {
        self.slots
            .iter()
            .filter_map(|s| match &s.content {
                LockContent::Lease(l, _) => Some(l.token),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The first free holder file below `limit`: a free one in use before, or the next new one.
    pub(crate) fn free_index(&self, limit: u32) -> Option<u32> {
        match self.slots.iter().find(|s| !s.occupied()) {
            Some(s) if s.k < limit => Some(s.k),
            Some(_) => None,
            None => {
                let next = self.slots.len() as u32;
                (next < limit.min(MAX_WIDTH)).then_some(next)
            }
        }
    }
}

/// `lease` as a released record: state released, `ended` saying `how`, by `me`.
pub(crate) fn released(
    mut lease: Lease,
    how: String,
    me: &Identity,
    clock: &dyn crate::clock::Clock,
) -> Lease {
    lease.state = LeaseState::Released;
    lease.ended = Some(Ending {
        at: format_rfc3339(clock.wall()),
        how,
        by: Some(format!(
            "{}@{} pid {}",
            me.user,
            me.host,
            std::process::id()
        )),
    });
    lease
}

/// Whether `want` agrees with the lock's setting: LOCK's `mode` (a format-1 LOCK is a plain
/// lock) while anybody holds the lock (`in_use`); anything goes while nobody does. A plain
/// (exclusive) contender and `--shared` agree: on a shared lock, the plain one is its exclusive
/// holder. A semaphore agrees only with the same number of slots.
pub(crate) fn agree(
    want: Want,
    mode: Option<Mode>,
    in_use: bool,
    lock: &std::path::Path,
) -> Result<()> {
    let held = mode.and_then(|m| m.slots);
    let ok = !in_use
        || match want {
            Want::Exclusive | Want::Shared => held.is_none(),
            Want::Slots(n) => mode.is_some() && held == Some(n),
        };
    if ok {
        return Ok(());
    }
    Err(Error::Mismatch {
        path: lock.to_path_buf(),
        held: match mode {
            Some(m) => m.setting(),
            None => "a plain (exclusive) lock".into(),
        },
        asked: want.setting(),
    })
}

/// The record LOCK holds while shared holders hold a shared lock: a released record (no
/// exclusive holder) in format 2, carrying `mode` — `base` (LOCK's record as read, token kept)
/// made so, or, when LOCK held none, a record of `me`'s with `token`.
pub(crate) fn lock_record(
    base: Option<&Lease>,
    mode: Mode,
    token: u64,
    fresh: impl FnOnce() -> Lease,
) -> Lease {
    let mut l = match base {
        Some(l) => l.clone(),
        None => {
            let mut l = fresh();
            l.state = LeaseState::Released;
            l.token = token;
            l.ended = Some(Ending {
                at: l.acquired_at.clone(),
                how: "no exclusive holder (a shared lock)".into(),
                by: None,
            });
            l
        }
    };
    l.state = LeaseState::Released;
    l.mode = Some(mode);
    l.damaged = false;
    l
}

/// After a holder file's release: rewrites LOCK's record of a shared lock as it is (a new file
/// renamed into place, under the mutex), so that the head waiter — which watches LOCK — wakes
/// to the freed place — when anyone is queued. Only a released shared-lock record is rewritten
/// (never an exclusive holder's lease); nothing happens when the mutex cannot be had in time
/// (the head then wakes at its next tick).
pub(crate) fn nudge(lock: &LockPaths, network: bool, wait: Duration, stuck_after: Duration) {
    // Nobody queued: nobody to wake. A waiter that queues later judges the holder files
    // under the mutex after our release was written (it was, before this look), so it sees the
    // freed place; waiters whose queueing failed wait unordered and see it at their next tick.
    if !crate::queue::any_ticket(lock) {
        return;
    }
    let deadline = Some(Instant::now() + wait);
    let Ok(_m) = mutex::lock_with(
        None,
        lock,
        deadline,
        stuck_after,
        StuckPolicy::Report,
        None,
        crate::klock::Where::of(network),
    ) else {
        return;
    };
    if let Ok(LockContent::Lease(l, _)) = fsio::read_lock(lock)
        && l.mode.is_some()
        && l.state == LeaseState::Released
        && !l.damaged
    {
        let _ = fsio::replace(lock, &lock.lock, &l.to_bytes(), false);
    }
}
