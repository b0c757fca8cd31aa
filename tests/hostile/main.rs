//! Hostile surroundings: files planted at leasehold's names, hostile lock contents, output
//! escaping, and jobs of several users sharing lock directories.

#[path = "../support/mod.rs"]
mod support;

mod harness;
mod hostile_files;
mod multiuser;
mod output;
mod planted_names;

/// Runs this binary as a worker when it was re-run as one (see `support::worker`); otherwise
/// does nothing.
#[test]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
