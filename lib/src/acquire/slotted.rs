//! One acquisition attempt on a shared or counted lock (`--shared`, `--slots N`; see
//! `slots.rs` and PROTOCOL.md §13), inside the section, for one-shot and blocking callers.
//!
//! Owns: the order of such an attempt — read and judge LOCK and every holder file, free the
//! dead holders' files (verified), refuse a setting that disagrees with the holders', and, first
//! in line only, enter when compatible: an exclusive contender when LOCK is free and no holder
//! file is held (it then writes a plain lease over LOCK), a shared or slotted one when LOCK
//! holds no exclusive lease and a holder file below the limit is free (it writes LOCK's shared
//! record, then its own lease into that file, with a token from the one sequence) — and in
//! both cases only if the holders' kernel marks agree (PROTOCOL.md §13: files can be forged).
//! Must never: enter while an exclusive lease is live, let an exclusive contender in while a
//! holder file is held, put more holders in files than the slot limit allows, or let anyone
//! overtake a live waiter.

use super::*;
use crate::record::Mode;
use crate::slots::{self, Holders, Look, Want};

/// Where the contender stands in line.
pub(super) struct Line<'k, S: Store> {
    pub kept: &'k mut S::Kept,
    pub ahead: Option<S::Ahead>,
    pub waiting_ahead: usize,
}

/// One pass inside the section (see the module comment). `q` is a blocking caller's state in
/// line (its place is used, not `place`); `None` for a one-shot caller, which never queues.
pub(super) fn attempt<S: Store>(
    ctx: &Ctx<'_, S>,
    section: S::Section,
    place: S::Place,
    content: LockContent,
    line: Line<'_, S>,
    mem: &mut Memory,
    mut q: Option<&mut Queued<S>>,
) -> Result<Attempt<S>> {
    let want = ctx.s.want;
    let lock = ctx.store.binding().lock().to_path_buf();
    let mode = slots::lock_mode(&content);
    let look = Look {
        me: &ctx.me,
        clock: ctx.s.clock.as_ref(),
        wall_skew: ctx.s.wall_skew,
        persist: true,
    };
    let mut one_shot_mems = Vec::new();
    let mems = match q.as_deref_mut() {
        Some(q) => &mut q.holders,
        None => &mut one_shot_mems,
    };
    let mut holders = Holders::read(&ctx.store, mode, look, mems)?;
    holders.clean(&section, ctx.s.take_over_hung, &ctx.me, look.clock)?;
    let mut v = judge(ctx).judge(&content, mem);
    let lock_live = matches!(v.state, State::Held | State::Hung);
    let occupied = holders.occupied();
    slots::agree(want, mode, lock_live || occupied > 0, &lock)?;
    let first = line.ahead.is_none();
    if first && let Some(broke) = decide(ctx, &mut v, q.is_some())? {
        let draft = q.as_deref_mut().and_then(|q| q.draft.take());
        // The floor of the next token: LOCK's and every holder file's (the high-water mark is
        // above them all anyway).
        let prev = v
            .lease
            .as_ref()
            .map_or(0, |l| l.token)
            .max(holders.max_token());
        let mut place = place;
        if let Some(q) = q.as_deref_mut() {
            place = std::mem::take(&mut q.place);
        }
        let limit = want.limit_or(crate::record::MAX_WIDTH);
        // The kernel's count, which no file decides (PROTOCOL.md §13): holders' marks that the
        // records do not show (a holder file removed, LOCK's width or record forged) keep the
        // contender out as their holders would.
        let would_enter = match want {
            Want::Exclusive => occupied == 0,
            Want::Shared | Want::Slots(_) => holders.free_index(limit).is_some(),
        };
        let blocked = if would_enter {
            marks_block(ctx, &section, &content, want, occupied)
        } else {
            None
        };
        if let Some(why) = &blocked {
            if v.state == State::Free {
                v.holder_unseen();
            }
            v.reason = format!("{why}; {}", v.reason);
        }
        match want {
            _ if blocked.is_some() => {}
            Want::Exclusive if occupied == 0 => {
                return take_in(ctx, &ctx.store, section, place, prev, broke, draft);
            }
            Want::Shared | Want::Slots(_) => {
                if let Some(k) = holders.free_index(limit) {
                    let width = (holders.slots.len() as u32).max(k + 1);
                    let new = Mode {
                        slots: want.limit(),
                        width,
                    };
                    write_lock(ctx, &section, &content, &v, broke.is_some(), new, prev)?;
                    let holder = ctx.store.holder(k);
                    return take_in(ctx, &holder, section, place, prev, broke, draft);
                }
            }
            Want::Exclusive => {}
        }
        // Not entering after all: the place goes back in line, the draft with it.
        if let Some(q) = q.as_deref_mut() {
            q.place = place;
            q.draft = draft;
        }
        return busy(ctx, section, v, holders, want, line, q);
    }
    busy(ctx, section, v, holders, want, line, q)
}

/// Why the holders' kernel marks keep a contender that the records would let in out, if they
/// do: for an exclusive contender, any shared or slotted holder's mark, or an exclusive
/// holder's mark of LOCK's token or above while LOCK shows no live lease; for a shared one,
/// that exclusive mark; for one of N slots, that mark or N shared holders' marks (`occupied`
/// is how many the holder files show).
fn marks_block<S: Store>(
    ctx: &Ctx<'_, S>,
    section: &S::Section,
    content: &LockContent,
    want: Want,
    occupied: usize,
) -> Option<String> {
    let cap = match want {
        Want::Slots(n) => n as usize,
        Want::Exclusive => 1,
        Want::Shared => 0,
    };
    let marks = if cap == 0 {
        0
    } else {
        ctx.store.shared_holders(section, cap)
    };
    if cap > 0 && marks >= cap {
        return Some(match want {
            Want::Slots(n) => format!(
                "{marks} holders of this lock hold their kernel marks (of {n} slots), though \
                 its holder files show {occupied}"
            ),
            _ => "a shared holder of this lock holds its kernel mark".into(),
        });
    }
    exclusive_unseen(ctx, section, content)
        .then(|| "an exclusive holder of this lock holds its kernel mark".into())
}

/// Writes LOCK's record of a shared lock with `mode` (see `slots::lock_record`), unless LOCK
/// already holds exactly that. `v` is LOCK's own verdict (free, or stale/hung and `broke`n:
/// its job stopped, verified).
fn write_lock<S: Store>(
    ctx: &Ctx<'_, S>,
    section: &S::Section,
    content: &LockContent,
    v: &Verdict,
    broke: bool,
    mode: Mode,
    token: u64,
) -> Result<()> {
    let base = match content {
        LockContent::Lease(l, _) if !broke && l.mode == Some(mode) && !l.damaged => return Ok(()),
        LockContent::Lease(l, _) if broke => Some(slots::released(
            (**l).clone(),
            format!("broken: {}", v.reason),
            &ctx.me,
            ctx.s.clock.as_ref(),
        )),
        LockContent::Lease(l, _) => Some((**l).clone()),
        _ => None,
    };
    let now = format_rfc3339(ctx.s.clock.wall());
    let fresh = || ctx.s.new_lease(&ctx.me, &ctx.timing, &now);
    let rec = slots::lock_record(base.as_ref(), mode, token, fresh);
    ctx.store.replace(section, &rec)
}

/// The contender cannot enter now: says what it waits for (LOCK's exclusive holder, or the
/// holders in the holder files), and leaves the section — in line for a blocking caller.
fn busy<S: Store>(
    ctx: &Ctx<'_, S>,
    section: S::Section,
    lock_verdict: Verdict,
    holders: Holders<S>,
    want: Want,
    line: Line<'_, S>,
    q: Option<&mut Queued<S>>,
) -> Result<Attempt<S>> {
    let all = holders.verdicts();
    let lock_busy = lock_verdict.state != State::Free;
    let mut v = match all.first() {
        Some(h) if !lock_busy => {
            let mut v = h.clone();
            v.reason = match want {
                Want::Slots(n) => format!("all {n} slots held ({})", h.reason),
                Want::Exclusive => format!(
                    "{} shared holder(s) hold it; an exclusive lease waits for all to go",
                    all.len()
                ),
                Want::Shared => format!("{} shared holders: no place left", all.len()),
            };
            v
        }
        _ => lock_verdict,
    };
    v.holders = all;
    if line.ahead.is_some() {
        behind_queue(&mut v, line.waiting_ahead);
    }
    match q {
        Some(q) => line_up(
            ctx,
            section,
            line.kept,
            q,
            v,
            line.ahead,
            line.waiting_ahead,
        ),
        None => {
            ctx.store.leave(section, line.kept);
            v.queue_ahead = line.waiting_ahead;
            Ok(Attempt::Busy(Box::new(v), line.ahead))
        }
    }
}
