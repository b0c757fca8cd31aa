//! The `leasehold` command line: run, status and break, contention between runs, fencing of the
//! command, the terminal, and the README's examples.

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod contention;
mod fencing;
mod readme;
mod terminal;

/// Runs this binary as a worker when it was re-run as one (see `support::worker`); otherwise
/// does nothing.
#[test]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
