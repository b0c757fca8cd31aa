//! What a break may break and what it did: the public outcome types of `break_lease`, shared
//! by the file store (`status.rs`) and the etcd store (`store/etcd/look.rs`).
//!
//! Owns: [`BreakMode`], [`Frees`], [`Broken`], [`AtTerminal`] — data only. Must never: depend on a store or
//! on the judge (both stores depend on it).

use std::time::Duration;

use crate::record::LeaseState;
use crate::verdict::Verdict;

/// What `break` may break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakMode {
    /// Only a stale lease; a live (held or hung) one is refused with the reason.
    Stale,
    /// Exactly the lease with this id, live or not: naming the id is the operator's confirmation.
    LeaseId(String),
    /// Whatever lease is there.
    Force,
}

/// When a broken lock becomes free for others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frees {
    /// At once: a released record was written.
    Now,
    /// Revoked, its holder on this host: free once none of its processes lives and no verified
    /// process is left in its group (it fences its command at its next renewal and exits). A
    /// holder still alive a TTL after the break is judged hung and stopped (verified).
    WhenGone {
        /// The holder's TTL.
        ttl: Duration,
    },
    /// Revoked, its holder on another host: free once each contender's host has seen the
    /// revoked record unchanged for the holder's TTL, on its own clock.
    AfterTtl {
        /// The holder's TTL.
        ttl: Duration,
    },
}

/// A script-mode lease's script that holds it from a terminal (`eval "$(leasehold lock L)"` in
/// a login shell): leasehold never signals a shell at a terminal, so a broken lease stays
/// blocking until that process ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtTerminal {
    /// The script's pid.
    pub pid: i32,
    /// Whom it runs as.
    pub user: String,
    /// Its controlling terminal: `/dev/pts/3`, or `pts/3` when its descriptors are not readable.
    pub tty: String,
}

/// The outcome of a break.
#[derive(Debug, Clone)]
pub struct Broken {
    /// The lease as it was judged just before breaking.
    pub verdict: Verdict,
    /// True when its holder was judged live: it will fence its command at its next renewal.
    pub was_live: bool,
    /// Processes of the old job that were stopped (verified against /proc) before breaking.
    pub stopped: usize,
    /// What LOCK says now: `Released` (free at once) or `Revoked` (see [`Broken::frees`]).
    pub written: LeaseState,
    /// When the lock becomes free for others.
    pub frees: Frees,
    /// Set when the lease's live processes were verifiably not holders of this lock (a forged
    /// or copied lease): what was found. It was replaced without signalling anything.
    pub forged: Option<String>,
    /// Processes of the old job that could not be checked, so were neither signalled nor
    /// judged gone (why the lease was revoked rather than stopped, or what a forced break of a
    /// stale lease left running).
    pub unchecked: Option<String>,
    /// A live script-mode lease held from a terminal: the process that must end before the lock
    /// frees (leasehold never signals it).
    pub at_terminal: Option<AtTerminal>,
    /// The lease was already revoked: nothing was written (writing it again would restart
    /// every other host's TTL).
    pub already_revoked: bool,
    /// On a shared or counted lock, the other holders broken by the same call (a stale-only
    /// break breaks every stale holder; a forced one every holder).
    pub more: Vec<Broken>,
}
