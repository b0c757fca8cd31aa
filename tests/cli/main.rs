//! The `leasehold` command line: run, status and break, contention between runs, fencing of the
//! command, the terminal, script mode (lock/unlock), the README's examples, the manual page,
//! completions and systemd recipe (`manual`), the `flock` name (`flock`), `run --json`'s events
//! (`json`), and the messages a first-time user reads (`messages`).

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod coexist;
mod contention;
mod defaults;
mod endings;
mod fencing;
mod flock;
mod json;
mod manual;
mod messages;
mod readme;
mod script;
mod shared;
mod skips;
mod terminal;

/// The entry point of worker processes (see `support::worker`): the tests re-run this binary
/// with `--exact worker --include-ignored` and a role. Ignored in a normal run, where it would
/// check nothing.
#[test]
#[ignore = "entry point of worker processes, run by the tests themselves"]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
