//! Why a held lease was lost, and who is told.
//!
//! Owns: [`LossReason`], the one account of a loss that the guard records, the store reports
//! and `leasehold run` shows, and the type of the `on_lost` callback.
//! Must never: depend on how a loss is found (no I/O, no protocol here).

use std::fmt;
use std::sync::Arc;

/// Why a guard was lost. Once lost, a guard stays lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// LOCK now holds someone else's lease (it was broken and taken, or replaced).
    Taken {
        /// Who holds it now, or what LOCK holds.
        by: String,
    },
    /// LOCK still holds our lease, broken: revoked by `break --force` or `--lease-id`, or marked
    /// released by a break that judged us gone.
    Broken {
        /// How, and by whom when LOCK says: `revoked by alice@web1 pid 4242`.
        how: String,
    },
    /// LOCK no longer leads to our lease: missing, not a lease, or the storage went away.
    Vanished {
        /// What we found.
        what: String,
    },
    /// No renewal succeeded before the renew deadline.
    RenewTimeout {
        /// The last error seen while renewing, if any.
        last_error: Option<String>,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Taken { by } => write!(f, "lease taken: LOCK now {by}"),
            LossReason::Broken { how } => write!(f, "lease broken: {how}"),
            LossReason::Vanished { what } => write!(f, "lease vanished: {what}"),
            LossReason::RenewTimeout {
                last_error: Some(e),
            } => {
                write!(f, "could not renew the lease before its deadline: {e}")
            }
            LossReason::RenewTimeout { last_error: None } => {
                write!(f, "could not renew the lease before its deadline")
            }
        }
    }
}

impl LossReason {
    /// [`LossReason::Broken`]'s `how` for a revoked lease: `revoked by WHO`, or `revoked`.
    pub(crate) fn revoked(by: Option<String>) -> String {
        by.map_or_else(|| "revoked".into(), |b| format!("revoked by {b}"))
    }
}

/// The `on_lost` callback.
pub(crate) type LostCallback = Arc<dyn Fn(&LossReason) + Send + Sync>;
