//! Fault injection: SIGKILLed and SIGSTOPped holders and waiters, cancelled jobs, full and vanishing disks,
//! other hosts (PID namespaces), clock skew, safe breaking, and a fuzz smoke test of the parser.

#[path = "../support/mod.rs"]
mod support;

mod break_safety;
mod cancel;
mod disk;
/// The etcd store on a real three-member cluster: built only with `--features etcd`
/// (`cargo test --release --features etcd --test faults -- etcd::`).
#[cfg(feature = "etcd")]
mod etcd;
/// The etcd store under network partitions, members and clients in network namespaces
/// (`cargo test --release --features etcd --test faults -- etcd_partition::`).
#[cfg(feature = "etcd")]
mod etcd_partition;
mod freeze;
mod fuzz_smoke;
mod gone;
mod hosts;
mod kill;
mod ns;
/// The S3 store on a real Ceph RADOS Gateway: built only with `--features s3`
/// (`cargo test --release --features s3 --test faults -- s3::`).
#[cfg(feature = "s3")]
mod s3;
mod skew;
/// The endings scenarios (issue 30) run on each networked store: `etcd::endings::`,
/// `s3::endings::`.
#[cfg(any(feature = "etcd", feature = "s3"))]
mod store_endings;
/// Script mode's `unlock` on each networked store: `etcd::`, `s3::`.
#[cfg(any(feature = "etcd", feature = "s3"))]
mod store_script;

/// The entry point of worker processes (see `support::worker`): the tests re-run this binary
/// with `--exact worker --include-ignored` and a role. Ignored in a normal run, where it would
/// check nothing.
#[test]
#[ignore = "entry point of worker processes, run by the tests themselves"]
fn worker() {
    let mut roles = support::COMMON_ROLES.to_vec();
    roles.push(("kill-cli-trials", kill::cli_trials_role));
    roles.push(("kill-cli-trials-starved", kill::cli_trials_starved_role));
    roles.push(("starve", kill::starve_role));
    support::worker::run(&roles);
}

/// Without `--features etcd` the etcd store's tests are not built: said on the terminal, as a
/// skip is, so that a passing run does not look as if it covered them.
#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_store_tests_need_the_etcd_feature() {
    support::env::say_skipped(
        "etcd::*",
        &format!("{}:{}", file!(), line!()),
        "the etcd store's tests need the cargo feature: cargo test --release --features etcd --test faults -- etcd::",
    );
}

/// Without `--features s3` the S3 store's tests are not built: said on the terminal, as a skip
/// is, so that a passing run does not look as if it covered them.
#[cfg(not(feature = "s3"))]
#[test]
fn s3_store_tests_need_the_s3_feature() {
    support::env::say_skipped(
        "s3::*",
        &format!("{}:{}", file!(), line!()),
        "the S3 store's tests need the cargo feature: cargo test --release --features s3 --test faults -- s3::",
    );
}
