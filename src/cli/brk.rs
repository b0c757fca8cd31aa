//! `leasehold break [--lease-id ID] [--force] LOCK`.
//!
//! Owns: choosing the break mode from the flags and saying, in one line, what was broken and why
//! (or why not). Must never: break a live lease unless its id was named or --force was given
//! (the library enforces it; this file only chooses the mode).

use crate::cli::args::BreakArgs;
use crate::cli::{exit, report};
use leasehold::{BreakMode, break_lease};

/// Runs `leasehold break` and returns the exit status (75 when refused).
pub(super) fn brk(a: &BreakArgs) -> i32 {
    let mode = match (&a.lease_id, a.force) {
        (Some(id), _) => BreakMode::LeaseId(id.clone()),
        (None, true) => BreakMode::Force,
        (None, false) => BreakMode::Stale,
    };
    match break_lease(&a.lock, mode) {
        Ok(b) => {
            if !a.quiet {
                say!("{}", report::broken_line(&b));
            }
            0
        }
        Err(e) => {
            say!("{}", report::error_line(&e));
            exit::exit_code(&e)
        }
    }
}
