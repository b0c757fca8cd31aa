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
mod refusals;
mod release;
mod tokens;
mod torn_reads;

/// Runs this binary as a worker when it was re-run as one (see `support::worker`); otherwise
/// does nothing.
#[test]
fn worker() {
    support::worker::run(support::COMMON_ROLES);
}
