//! The `leasehold` command line: run, status and break, contention between runs, fencing of the
//! command, the terminal, and the README's examples.

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod contention;
mod fencing;
mod readme;
mod shared;
mod terminal;

/// The entry point of worker processes (see `support::worker`): the tests re-run this binary
/// with `--exact worker --include-ignored` and a role. Ignored in a normal run, where it would
/// check nothing.
#[test]
#[ignore = "entry point of worker processes, run by the tests themselves"]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
