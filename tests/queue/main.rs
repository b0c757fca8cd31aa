//! The wait queue: waiters are served in arrival order, killed and frozen waiters do not stall
//! it, a release wakes only the head, and timeouts and cancelled waits leave no ticket behind.

#[path = "../support/mod.rs"]
mod support;

mod cancel;
mod order;

/// The entry point of worker processes (see `support::worker`): the tests re-run this binary
/// with `--exact worker --include-ignored` and a role. Ignored in a normal run, where it would
/// check nothing.
#[test]
#[ignore = "entry point of worker processes, run by the tests themselves"]
fn worker() {
    let mut roles = support::COMMON_ROLES.to_vec();
    roles.push(("queue-waiter", order::waiter_role));
    roles.push(("looper", order::looper_role));
    support::worker::run(&roles);
}
