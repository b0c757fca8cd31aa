//! Issue 5, "kills at every step", library holders: ≥ 1,000 trials (LEASEHOLD_TRIALS) of
//! SIGKILLing holders and waiters (separate processes using the library) at random points; the
//! next run always gets the lock within TTL + 1 s, LOCK always parses, no stray files, tokens
//! grow, critical sections never overlap. See tests/faults/kill.rs.

#[path = "faults/common.rs"]
mod common;
#[path = "faults/kill.rs"]
mod kill;

#[test]
fn helper() {
    common::helper_main();
}

#[test]
fn kill_library_holders_and_waiters_at_random_points() {
    let trials = common::base_trials();
    let f = kill::run_trials(kill::Mode::Library, trials);
    kill::print("library", &f);
    assert_eq!(f.violations, 0);
}
