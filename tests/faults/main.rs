//! Fault injection: SIGKILLed and SIGSTOPped holders and waiters, full and vanishing disks,
//! other hosts (PID namespaces), clock skew, safe breaking, and a fuzz smoke test of the parser.

#[path = "../support/mod.rs"]
mod support;

mod break_safety;
mod disk;
mod freeze;
mod fuzz_smoke;
mod hosts;
mod kill;
mod ns;
mod skew;

/// Runs this binary as a worker when it was re-run as one (see `support::worker`); otherwise
/// does nothing.
#[test]
fn worker() {
    let mut roles = support::COMMON_ROLES.to_vec();
    roles.push(("kill-cli-trials", kill::cli_trials_role));
    support::worker::run(&roles);
}
