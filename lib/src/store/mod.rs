//! The seam between the lease protocol and where leases are kept.
//!
//! Owns: the [`Store`] and [`Holding`] traits — the contract every store must keep for the
//! protocol's safety argument (PROTOCOL.md §8) to hold — and the answer to "is this still our
//! lease?" ([`Ours`]). The lock file ([`file::FileStore`]) and the S3 object
//! (`s3::acquire::S3Store`, whose section is a compare-and-swap) implement [`Store`] and are
//! driven by the one acquisition loop (`acquire.rs`); the etcd store (`etcd/`) keeps etcd's
//! lock recipe, in which nobody replaces a record (a contender's own key waits for the keys
//! ahead of it to go), and implements [`Holding`], so the guard, the keeper and `leasehold run`
//! are the same for all three. `kind` parses LOCK into a store ([`Kind::of`]) and reaches the
//! networked ones; `any` dispatches a held lease to its store, `binding` says how a store's
//! jobs are bound to its lock, `resolved` keeps what a builder resolved between acquisitions.
//! Must never: hold policy. Which lease may be taken, when a holder is dead, what a break does
//! are decided by `judge.rs`, `acquire.rs`, `takeover.rs` and `status.rs`; a store only reads,
//! compares-and-replaces, renews, releases, hands out tokens and waits.

use std::time::{Duration, Instant};

use crate::boottime::BootInstant;
use crate::error::Result;
use crate::fsio::LockContent;
use crate::judge::Judge;
use crate::loss::LossReason;
use crate::record::Lease;
use crate::verdict::Verdict;

pub(crate) mod any;
pub(crate) mod binding;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod file;
mod kind;
pub(crate) mod resolved;
#[cfg(feature = "s3")]
pub(crate) mod s3;

pub(crate) use binding::Binding;
pub(crate) use kind::{Kind, ack_elsewhere, acquire_elsewhere, break_elsewhere, status_elsewhere};

/// What a store does about a contender that has sat in the exclusive section for longer than a
/// TTL (the file store: a process holding the mutex's flock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StuckPolicy {
    /// Report it and give up.
    Report,
    /// Stop it if the store's own authority names it as the section's holder, it runs as our
    /// uid, and it is stopped (SIGSTOP, a frozen cgroup): it can never leave by itself.
    KillStopped,
}

/// Where leases on one lock are kept, as the protocol needs it.
///
/// The contract (what the safety argument relies on):
/// - **One exclusive section at a time.** Between [`Store::enter`] and [`Store::leave`] (or
///   [`Store::take`], which ends it) no other contender, on any host, is inside its own section
///   for the same lock. Everything that changes the current lease, except a renewal and a
///   release in place, happens inside one — so what [`Store::current`] read there is still what
///   the store holds when [`Store::take`] or [`Store::replace`] writes: **compare-and-replace is
///   atomic against every other contender.** A section is never held while a job runs, and
///   `enter` never waits past its deadline. A store with no exclusion but a compare-and-swap
///   (S3's conditional writes) keeps the same guarantee the other way round: its `take` and
///   `replace` write only if the store still holds exactly what `current` read, and otherwise
///   write nothing ([`Error::Raced`](crate::Error::Raced); the loop reads again).
/// - **Reads are fresh.** [`Store::read`] and [`Store::current`] return what the store holds now
///   (never a cached answer older than the last change another host could have made and been
///   acknowledged for), and never a torn record: a damaged one is marked so.
/// - **Tokens strictly increase.** The token [`Store::take`] gives a new lease is greater than
///   every token any earlier lease on this lock had, whatever happened in between (crashes,
///   breaks, a lease file emptied by hand), and it is durable before the lease is visible. A
///   token reserved while waiting ([`Store::join`]) is used only if still greater than all.
/// - **A new lease is durable before it counts.** `take` returns only once the lease is stored
///   as durably as the store can; the guard's renew deadline counts from before it was visible.
/// - **Order among waiters.** A contender with a place in line ([`Store::Place`]) is first only
///   when nobody that joined before it is still waiting ([`Store::ahead`]); a place whose owner
///   died or froze for a TTL is given up by the store, and its owner finds that out.
/// - **Waiting ends on a change.** [`Store::wait`] returns when the current lease may have
///   changed, when the one ahead in line may have gone, or at the latest after a tick short
///   enough to see a silent holder's TTL run out — and never after the deadline.
pub(crate) trait Store: Send + Sync + Sized + 'static {
    /// What one contender keeps between its sections (the file store: the mutex descriptor).
    type Kept: Default + Send;
    /// A held exclusive section.
    type Section;
    /// A waiting contender's place in line, and what it prepares there for its take.
    type Place: Default + Send;
    /// The contender just ahead in line, to wait behind.
    type Ahead: Send;
    /// What wakes a waiting contender (kept across waits: setting it up may cost).
    type Waker: Send;
    /// A held lease's link to the store.
    type Holding: Holding + Into<any::AnyHolding>;

    /// How this lock's jobs are bound to it (see [`Binding`]).
    fn binding(&self) -> &dyn Binding;

    /// The store of holder `k` of a shared or counted lock (`slots.rs`): its own lease (heartbeat,
    /// token, judgement, fencing) in a place of its own, sharing this lock's exclusive section,
    /// token sequence, line of waiters and name.
    fn holder(&self, k: u32) -> Self;

    /// The judge of this store's leases (see `judge.rs`).
    fn judge<'a>(
        &'a self,
        me: &'a crate::identity::Identity,
        clock: &'a dyn crate::clock::Clock,
    ) -> Judge<'a> {
        Judge {
            binding: self.binding(),
            me,
            clock,
            wall_skew: None,
            persist: true,
        }
    }

    /// What the store holds now, read outside any section.
    fn read(&self) -> Result<LockContent>;

    /// Enters the exclusive section, waiting at most until `deadline`. A section held by a
    /// stopped process for longer than `stuck_after` is handled by `policy`; while it waits,
    /// `place`'s liveness is kept up, and `blocked`, if given, is told (once a second at most)
    /// who holds the section, by the kernel's (or server's) word.
    fn enter(
        &self,
        kept: &mut Self::Kept,
        deadline: Option<Instant>,
        stuck_after: std::time::Duration,
        policy: StuckPolicy,
        place: Option<&mut Self::Place>,
        blocked: Option<&mut dyn FnMut(&str)>,
    ) -> Result<Self::Section>;

    /// Leaves the section without taking the lease.
    fn leave(&self, section: Self::Section, kept: &mut Self::Kept);

    /// Inside the section: the current lease (through what `place` kept from its last look,
    /// and keeping what helps the next look and the take).
    fn current(&self, section: &Self::Section, place: &mut Self::Place) -> Result<LockContent>;

    /// Inside the section: the live contenders ahead of `place` (of everyone, without one),
    /// giving up those whose owners died or froze: the one just ahead, and how many.
    fn ahead(
        &self,
        section: &Self::Section,
        place: Option<&mut Self::Place>,
        ttl: std::time::Duration,
    ) -> Result<(Option<Self::Ahead>, usize)>;

    /// Who `ahead` is, by the kernel's (or server's) word: for wait lines.
    fn describe(&self, ahead: &Self::Ahead) -> String;

    /// Whether a waiter must poll: other hosts' changes are not notified (a network file
    /// system).
    fn polls(&self) -> bool;

    /// Inside the section, for a contender that cannot take the lease yet: gives it a place in
    /// line if it has none (saying `who` waits there), and, when it is `first`,
    /// reserves the token after `current_token` durably, so that its take need not write it.
    fn join(
        &self,
        section: &Self::Section,
        place: &mut Self::Place,
        current_token: u64,
        first: bool,
        who: Joiner<'_>,
    ) -> Result<()>;

    /// Outside the section, while waiting first in line: prepares the take of `lease` (the
    /// bytes it will have) so that it costs as little as possible.
    fn prepare(&self, place: &mut Self::Place, lease: &[u8]);

    /// Takes the lease, ending the section: picks the token (see the contract), asks `lease`
    /// for the record with it, and replaces the current lease with it — atomically against
    /// every other contender, and durably before returning. `prev_token` is the token of the
    /// lease replaced; `place` is the taker's place in line, given up as it takes the lease.
    /// [`Error::Raced`](crate::Error::Raced) (a store whose section is a compare-and-swap) when
    /// another contender changed the lease since [`Store::current`] read it: nothing was
    /// written, look again.
    fn take(
        &self,
        section: Self::Section,
        place: Self::Place,
        prev_token: u64,
        lease: &mut dyn FnMut(u64) -> (Lease, Vec<u8>),
    ) -> Result<Took<Self::Holding>>;

    /// Inside the section, before what [`Store::current`] read is judged: our own lease, if
    /// it is there because a take of ours whose answer was lost landed after all (a networked
    /// store; otherwise we would judge our own lease held and wait behind ourselves). Default:
    /// never (a store whose takes always answer).
    fn landed(
        &self,
        _section: &Self::Section,
        _content: &LockContent,
    ) -> Option<Took<Self::Holding>> {
        None
    }

    /// Inside the section: replaces the current lease with `lease` (a break: released or
    /// revoked, its token kept), durably.
    fn replace(&self, section: &Self::Section, lease: &Lease) -> Result<()>;

    /// After a stale lease's job was stopped, inside the section: removes what a writer that
    /// died mid-write may have left.
    fn clean_after_crash(&self);

    /// Inside the section: whether a holder of this lock with token `from` or above still
    /// holds its kernel mark, whatever the lease record says — asked when the record says the
    /// lock is free (missing, emptied, released: `from` is the token it shows, 0 if none),
    /// which a record removed or replaced under a running holder also says. Default: no mark.
    fn marked(&self, _section: &Self::Section, _from: u64) -> bool {
        false
    }

    /// Inside the section: who holds a kernel lock on LOCK's own file, if anyone does (util-linux
    /// flock(1) or another program; a leasehold holder's own lock goes before its record says
    /// it is free), in words — not counting `frozen`'s, a hung holder left frozen by a takeover,
    /// when the kernel binds the lock to it. Default: no such lock (a store with no file).
    fn kernel_locked(&self, _section: &Self::Section, _frozen: Option<&Lease>) -> Option<String> {
        None
    }

    /// Inside the section: how long nothing may be granted yet because LOCK's storage came
    /// back as another attachment of its disk in this boot (PROTOCOL.md §8, *Durable per mount
    /// epoch*), and the longest TTL that wait is for. Default: never (a store whose records
    /// are durable when written).
    fn settling(&self, _section: &Self::Section) -> Option<(Duration, Duration)> {
        None
    }

    /// Inside the section: how many shared or slotted holders of this lock hold their kernel
    /// marks (PROTOCOL.md §13), counted up to `cap` — whatever LOCK and the holder files say,
    /// which a directory writer can delete or forge. Default: none (a store whose records
    /// nobody but its holders can change).
    fn shared_holders(&self, _section: &Self::Section, _cap: usize) -> usize {
        0
    }

    /// Inside the section: whether the kernel says at once that no holder of this lock holds
    /// a mark of any kind — no [`Store::marked`] from token 0 and no [`Store::shared_holders`]
    /// — so that neither need be asked (one look instead of four). `false` when it cannot
    /// say so (the two are then asked as ever). Default: `false`.
    fn no_marks(&self, _section: &Self::Section) -> bool {
        false
    }

    /// What wakes this contender, set up lazily (see [`Store::wait`]).
    /// `cancel`, when given, ends any wait at once once it is cancelled.
    fn waker(
        &self,
        poll: bool,
        ttl: std::time::Duration,
        cancel: Option<crate::cancel::Cancel>,
    ) -> Self::Waker;

    /// Outside the section: keeps `place` alive, then sleeps until the lease judged `seen` may
    /// have changed (or, with `ahead`, the contender ahead may have gone), a tick passes, or
    /// `deadline`.
    fn wait(
        &self,
        waker: &mut Self::Waker,
        place: &mut Self::Place,
        ahead: Option<&Self::Ahead>,
        seen: &Verdict,
        deadline: Option<Instant>,
    );

    /// Who waits, in order (for `status`).
    fn waiting(&self) -> Vec<crate::verdict::Waiting>;
}

/// A held lease's link to its store: what the guard renews, checks and releases through.
///
/// The contract:
/// - **Renew fails once the lease is not ours.** [`Holding::renew`] writes the new heartbeat
///   only after seeing that the store still holds our lease, held; if it holds anything else
///   (another lease, ours revoked or released, nothing) the renewal is lost, never counted. A
///   renewal racing a replacement either lands before it (and the replacer sees it) or is lost
///   with the replaced record. It needs no section.
/// - **Nothing is written once it is not ours.** [`Holding::rewrite`] and [`Holding::release`]
///   check, inside a section (or, for a release in place, on the very record we wrote), that
///   the store holds our lease, and write nothing otherwise.
/// - **Release frees the lock at once, or says it could not.** After `release` returns `Ok`,
///   every contender judges the lock free (a released record, or our record marked released).
pub(crate) trait Holding: Send + Sync + 'static {
    /// Whether the store still holds our lease `lease_id`, and how (a fresh read).
    fn still_ours(&self, lease_id: &str) -> Result<Ours>;

    /// One renewal: replaces our record's heartbeat with `bytes`' (the same record, heartbeat
    /// moved) if the store still holds our lease `lease_id`, held. `Err(Renewal::Lost)` is
    /// final; `Err(Renewal::Transient)` is retried until the deadline.
    fn renew(&self, lease_id: &str, bytes: &[u8]) -> std::result::Result<(), Renewal>;

    /// A look between renewals, writing nothing: `Err(Renewal::Lost)` when the store plainly no
    /// longer holds our lease (LOCK missing, emptied, replaced by another file, taken, revoked,
    /// released); `Ok` otherwise, transient failures included (the renewals judge those). Made
    /// when [`Holding::watched`] shows a change. Default: nothing to look at.
    fn check(&self, _lease_id: &str) -> std::result::Result<(), Renewal> {
        Ok(())
    }

    /// Where a change to our record shows on this host: a directory inotify can watch (a path
    /// that leads to the very directory the lease was taken in) and the record's name in it.
    /// `None` (the default): no such place.
    fn watched(&self) -> Option<(std::path::PathBuf, std::ffi::OsString)> {
        None
    }

    /// A duplicate of the descriptor on which we hold a kernel lock on our lease's own file
    /// (`klock::hold_lock_file`), for a process that must keep that lock past ours (the
    /// binary's guardian, until the job is stopped). `None` (the default): we hold none.
    fn kernel_lock(&self) -> Option<std::os::fd::OwnedFd> {
        None
    }

    /// Duplicates of the descriptors on which we hold the lock of files that are no longer
    /// our lease's (the file our lease replaced, claimed; our own earlier files), for a process
    /// that must serve programs blocked on them if we die (`handover::serve_old_waiters`).
    /// Empty (the default): none.
    fn old_locks(&self) -> Vec<std::os::fd::OwnedFd> {
        Vec::new()
    }

    /// A held section, for [`Holding::rewrite`].
    type Section;

    /// Enters the exclusive section, waiting at most until `deadline` (a stopped process
    /// holding it for longer than `stuck_after` is stopped, verified).
    fn enter(&self, deadline: Instant, stuck_after: std::time::Duration) -> Result<Self::Section>;

    /// Inside `section`: replaces our record (`mine`) with `bytes` (recording the wrapped
    /// command), if the store still holds it, held; `Error::Lost` otherwise.
    fn rewrite(&self, section: &Self::Section, mine: &Lease, bytes: &[u8]) -> Result<()>;

    /// Releases our lease (see [`Release`]). Called once, with our record locked, so that no
    /// renewal runs; calls `release.stop` (which ends the guard's renewals) as soon as it can.
    fn release(&self, release: Release<'_>) -> Result<()>;
}

/// A lease [`Store::take`] made ours: its record, the record's bytes, when the write that made
/// it visible began (the renew deadline counts from there), and its link to the store.
pub(crate) type Took<H> = (Lease, Vec<u8>, BootInstant, H);

/// Who joins the line, as its place says (shown by `status`; never trusted to name who waits).
pub(crate) struct Joiner<'a> {
    pub me: &'a crate::identity::Identity,
    pub clock: &'a dyn crate::clock::Clock,
    /// What it wants to run.
    pub command: &'a [String],
}

/// What a release hands to the store.
pub(crate) struct Release<'a> {
    /// Our lease as last written, and its exact bytes.
    pub mine: &'a Lease,
    pub bytes: &'a [u8],
    /// How the job ended, for the released record.
    pub how: &'a str,
    pub clock: &'a dyn crate::clock::Clock,
    /// The longest wait for a section, and after how long a stopped holder of it is judged.
    pub wait: std::time::Duration,
    pub stuck_after: std::time::Duration,
    /// Ends the guard's renewals.
    pub stop: &'a mut dyn FnMut(),
    /// Whether the lease was lost (the job was fenced) before this release (the etcd store
    /// revokes its lease then; the S3 store makes one quick try; the file store's release is
    /// the same either way).
    #[cfg_attr(not(any(feature = "etcd", feature = "s3")), allow(dead_code))]
    pub lost: bool,
    /// Hears of each program the release lets run first (the builder's `on_serve`).
    pub on_serve: Option<&'a (dyn Fn(&crate::Served) + Send + Sync)>,
}

/// Why a renewal failed.
#[derive(Debug)]
pub(crate) enum Renewal {
    /// The lease is gone for good.
    Lost(LossReason),
    /// A transient error: try again until the deadline.
    Transient(crate::error::Error),
}

/// What the store holds, as far as our lease is concerned: the one answer to "is this still
/// our lease?", for renewals, releases, `set_child` and the wrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ours {
    /// Our lease, held.
    Held,
    /// Our lease, revoked by an operator; by whom, if recorded.
    Revoked(Option<String>),
    /// Our lease, released (broken, or by the released bit).
    Released,
    /// Someone else's lease: who, and its token.
    Taken(String, u64),
    /// Nothing (an empty lock file: freed by hand).
    Empty,
    /// No lease record at all.
    Missing,
}

/// Whether `content` (what the store holds) is our lease `lease_id`, and in what state.
pub(crate) fn ours(content: &LockContent, lease_id: &str) -> Ours {
    use crate::record::LeaseState;
    match content {
        LockContent::Lease(l, _) if l.lease_id == lease_id => match l.state {
            LeaseState::Held => Ours::Held,
            LeaseState::Revoked => Ours::Revoked(l.ended.as_ref().and_then(|e| e.by.clone())),
            LeaseState::Released => Ours::Released,
        },
        LockContent::Lease(l, _) => Ours::Taken(l.holder.describe(), l.token),
        LockContent::Empty => Ours::Empty,
        LockContent::Missing => Ours::Missing,
    }
}
