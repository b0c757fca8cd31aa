//! Hostile surroundings: files planted at leasehold's names, hostile lock contents, output
//! escaping, and jobs of several users sharing lock directories.

#[path = "../support/mod.rs"]
mod support;

mod harness;
mod hostile_files;
mod multiuser;
mod mutex_deleter;
mod output;
mod planted_names;
mod round_two;
mod script_users;
mod tampered_slots;

/// The entry point of worker processes (see `support::worker`): the tests re-run this binary
/// with `--exact worker --include-ignored` and a role. Ignored in a normal run, where it would
/// check nothing.
#[test]
#[ignore = "entry point of worker processes, run by the tests themselves"]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
