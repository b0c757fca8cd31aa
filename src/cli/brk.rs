//! `leasehold break [--lease-id ID] [--force] LOCK`.
//!
//! Owns: choosing the break mode from the flags and saying, in one line, what was broken and why
//! (or why not). Must never: break a live lease unless its id was named or --force was given
//! (the library enforces it; this file only chooses the mode).

use crate::cli::args::BreakArgs;
use crate::cli::{exit, report};
use leasehold::{BreakMode, Error, break_lease};

/// Runs `leasehold break` and returns the exit status (75 when refused).
pub(super) fn brk(a: &BreakArgs) -> i32 {
    let mode = match (&a.lease_id, a.force) {
        (Some(id), _) => BreakMode::LeaseId(id.clone()),
        (None, true) => BreakMode::Force,
        (None, false) => BreakMode::Stale,
    };
    let stale_only = mode == BreakMode::Stale;
    // A file locked by the `flock` front end keeps its lease beside it (never an ordinary
    // LOCK's: see `flock_lease_of`).
    let lease = super::status::flock_lease_of(&a.lock);
    match break_lease(lease.as_deref().unwrap_or(&a.lock), mode) {
        Ok(b) => {
            if !a.quiet {
                say!("{}", report::broken_line(&b));
                for more in &b.more {
                    say!("{}", report::broken_line(more));
                }
            }
            0
        }
        Err(e) => {
            let e = if stale_only { with_flags(e) } else { e };
            say!("{}", report::error_line(&e));
            exit::exit_code(&e)
        }
    }
}

/// The library's refusal to break a live lease says how in its own words ("break it by its lease
/// id ID, or by force"); say it with this command's flags.
fn with_flags(e: Error) -> Error {
    match e {
        Error::Refused { path, why } => {
            let flags = why.rsplit_once("; ").and_then(|(head, tail)| {
                let id = tail
                    .strip_prefix("break it by its lease id ")?
                    .strip_suffix(", or by force")?;
                Some(format!(
                    "{head}; name it with --lease-id {id} or use --force"
                ))
            });
            Error::Refused {
                path,
                why: flags.unwrap_or(why),
            }
        }
        e => e,
    }
}
