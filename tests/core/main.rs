//! The library: mutual exclusion, liveness of holders, breaking, releasing, fencing tokens,
//! refusals of what is not a lease, torn reads, and a full disk.

#[path = "../support/mod.rs"]
mod support;

mod breaking;
mod exclusion;
mod exclusion_kill;
mod full_disk;
mod liveness;
mod mutex;
mod rate_skew;
mod refusals;
mod release;
mod shared;
mod tokens;
mod torn_reads;

/// The entry point of worker processes (see `support::worker`): the tests re-run this binary
/// with `--exact worker --include-ignored` and a role. Ignored in a normal run, where it would
/// check nothing.
#[test]
#[ignore = "entry point of worker processes, run by the tests themselves"]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
