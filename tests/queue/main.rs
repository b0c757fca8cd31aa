//! The wait queue: waiters are served in arrival order, killed and frozen waiters do not stall
//! it, a release wakes only the head, and timeouts leave no ticket behind.

#[path = "../support/mod.rs"]
mod support;

mod order;

/// Runs this binary as a worker when it was re-run as one (see `support::worker`); otherwise
/// does nothing.
#[test]
fn worker() {
    let mut roles = support::COMMON_ROLES.to_vec();
    roles.push(("queue-waiter", order::waiter_role));
    roles.push(("looper", order::looper_role));
    support::worker::run(&roles);
}
