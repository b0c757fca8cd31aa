//! `status` and `break` on a shared or counted lock (`--shared`, `--slots N`; see `slots.rs`):
//! every holder file is looked at and broken like LOCK's own lease.
//!
//! Owns: listing the holders of a shared lock in the verdict `status` returns (and its overall
//! state: held while any holder holds), and the break of its holders — by lease id exactly
//! that holder, stale-only every stale holder (and nobody else), forced every holder — each
//! through the one [`Breaker`] LOCK's own lease is broken with.
//! Must never: break a live holder without its lease id named or force; touch a holder other
//! than the one named; change anything while only looking.

use super::*;
use crate::record::Mode;
use crate::slots::{Holders, Look};

/// For `status`: lists the holders of the lock whose LOCK records `mode` in `v` (LOCK's own
/// verdict), and makes `v`'s state say whether any of them holds it.
pub(crate) fn look<S: Store>(store: &S, mode: Mode, v: &mut Verdict, look: Look<'_>) -> Result<()> {
    let holders = Holders::read(store, Some(mode), look, &mut Vec::new())?;
    v.holders = holders.verdicts();
    if v.state == State::Free && !v.holders.is_empty() {
        let worst = |s: State| v.holders.iter().any(|h| h.state == s);
        v.state = [State::Held, State::Hung, State::Stale]
            .into_iter()
            .find(|s| worst(*s))
            .unwrap_or(State::Held);
        v.reason = summary(mode, v.holders.len());
    }
    Ok(())
}

/// `3 shared holders` or `2 of 3 slots held`.
pub(crate) fn summary(mode: Mode, n: usize) -> String {
    match mode.slots {
        None => format!("{n} shared holder(s) (--shared)"),
        Some(max) => format!("{n} of {max} slots held (--slots {max})"),
    }
}

/// `break` on a shared lock, inside the section: LOCK's own lease (judged `v`) if it is not
/// free, and the holder files, as `mode` says. The first break is returned, the others in its
/// `more`.
pub(crate) fn brk<S: Store>(
    store: &S,
    section: &S::Section,
    lock_mode: Mode,
    content: &LockContent,
    v: &Verdict,
    mode: &BreakMode,
    look: Look<'_>,
) -> Result<Broken> {
    let holders = Holders::read(store, Some(lock_mode), look, &mut Vec::new())?;
    let by = format!(
        "{}@{} pid {}",
        look.me.user,
        look.me.host,
        std::process::id()
    );
    let mut targets: Vec<(&S, &Lease, &Verdict)> = Vec::new();
    if let (LockContent::Lease(l, _), false) = (content, v.state == State::Free) {
        targets.push((store, l, v));
    }
    for s in holders.slots.iter().filter(|s| s.occupied()) {
        if let LockContent::Lease(l, _) = &s.content {
            targets.push((&s.store, l, &s.verdict));
        }
    }
    let chosen: Vec<_> = match mode {
        BreakMode::LeaseId(id) => targets
            .into_iter()
            .filter(|(_, l, _)| l.lease_id.eq_ignore_ascii_case(id))
            .collect(),
        BreakMode::Stale => targets
            .into_iter()
            .filter(|(_, _, v)| v.state == State::Stale)
            .collect(),
        BreakMode::Force => targets,
    };
    let refuse = |why: String| Error::Refused {
        path: store.binding().lock().to_path_buf(),
        why,
    };
    if chosen.is_empty() {
        let live: Vec<String> = holders
            .slots
            .iter()
            .filter(|s| s.occupied())
            .filter_map(|s| s.verdict.lease.as_ref().map(|l| l.lease_id.clone()))
            .collect();
        return Err(refuse(match mode {
            BreakMode::LeaseId(id) => format!(
                "no holder has lease id {id}: nothing broken ({})",
                summary(lock_mode, live.len())
            ),
            _ if live.is_empty() && v.state == State::Free => format!("nothing to break: {v}"),
            _ => format!(
                "refusing to break a live lease: {}, none stale; break one by its lease id ({}), or by force",
                summary(lock_mode, live.len()),
                live.join(", ")
            ),
        }));
    }
    let mut out: Option<Broken> = None;
    for (s, lease, hv) in chosen {
        let b = Breaker {
            store: s,
            section,
            lease,
            v: hv,
            by: by.clone(),
            clock: look.clock,
        };
        let broken = super::break_judged(&b, mode)?;
        match &mut out {
            None => out = Some(broken),
            Some(o) => o.more.push(broken),
        }
    }
    out.ok_or_else(|| refuse("nothing broken".into()))
}
