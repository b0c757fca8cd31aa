//! The `LEASEHOLD_PREVIOUS*` values: how the holding before this one ended, as the command (and
//! a `--recover` command) gets them in its environment.
//!
//! Owns: the variables' names and order, and their values from the lock's memory (kept and
//! classified by the library: `lib/src/ending.rs`). A leaf: `supervise` (which passes them
//! through the gate) and `ending` both use it, and it uses neither. Must never: print, or
//! decide whether the command runs.

use leasehold::{LastEnding, LeaseGuard};

/// The variables the command gets about the holding before it, in the gate's order.
pub(crate) const PREVIOUS: [&str; 5] = [
    "LEASEHOLD_PREVIOUS",
    "LEASEHOLD_PREVIOUS_STATUS",
    "LEASEHOLD_PREVIOUS_HOST",
    "LEASEHOLD_PREVIOUS_TOKEN",
    "LEASEHOLD_PREVIOUS_ENDED",
];

/// The `LEASEHOLD_PREVIOUS*` values for `guard`'s lease, in [`PREVIOUS`]'s order: `none` and
/// empty values when no ending is known; the status only when released.
pub(crate) fn previous_env(guard: &LeaseGuard) -> Vec<(&'static str, String)> {
    previous_values(guard.previous().as_ref(), &guard.lease().acquired_at)
}

/// The `LEASEHOLD_PREVIOUS*` values for a holding acquired at `acquired` after `last`.
pub(crate) fn previous_values(
    last: Option<&LastEnding>,
    acquired: &str,
) -> Vec<(&'static str, String)> {
    let vals = match last {
        None => [
            "none".to_string(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ],
        Some(p) => [
            p.end.word().to_string(),
            p.exit_status().map(|s| s.to_string()).unwrap_or_default(),
            p.host.clone(),
            p.token.to_string(),
            p.ended_at(acquired).to_string(),
        ],
    };
    PREVIOUS.into_iter().zip(vals).collect()
}
