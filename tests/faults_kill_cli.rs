//! Issue 5, "kills at every step", through `leasehold run`: ≥ 1,000 trials (LEASEHOLD_TRIALS)
//! of SIGKILLing `leasehold run` holders and waiters at random points; the next run always gets
//! the lock within TTL + 1 s, LOCK always parses (`leasehold status --json` exits 0), no stray
//! files, tokens grow, and the wrapped commands never overlap (a killed wrapper's command dies
//! with it or is stopped before the next command starts). See tests/faults/kill.rs.
//!
//! Alone in its test binary: it makes the process a child subreaper and reaps orphans with
//! waitpid(-1), which must not race other tests' children.

#[path = "faults/common.rs"]
mod common;
#[path = "faults/kill.rs"]
mod kill;

#[test]
fn helper() {
    common::helper_main();
}

#[test]
fn kill_cli_holders_and_waiters_at_random_points() {
    if common::need_cli() {
        return;
    }
    let trials = common::base_trials();
    let f = kill::run_trials(kill::Mode::Cli, trials);
    kill::print("leasehold run", &f);
    assert_eq!(f.violations, 0);
}
