//! The lock remembers how the last holding ended on etcd (issue 30, PROTOCOL.md §14
//! *Endings*): `store_endings.rs`'s scenarios on a real three-member cluster. Run as
//! `etcd::endings::`.

use crate::support::etcd::Cluster;
use crate::support::lh;

use crate::store_endings as scenarios;
use scenarios::On;

/// Each test its own cluster (a 3-member cluster starts in a few seconds).
fn with(f: impl FnOnce(&On<'_>)) {
    let Some(cl) = Cluster::start() else { return };
    let url = |name: &str| cl.url(name);
    f(&On {
        cmd: &lh,
        url: &url,
        dir: cl.path(),
    });
}

#[test]
fn etcd_previous_is_released_3_died_fenced_and_broken() {
    // A SIGKILLed holder's key ends with its etcd lease: TTL 2 s.
    with(|on| scenarios::previous_is_released_3_died_fenced_and_broken(on, "2s"));
}

#[test]
fn etcd_after_crash_fail_refuses_until_ack_and_recover_runs_only_after_unclean_endings() {
    with(scenarios::after_crash_fail_until_ack_and_recover);
}

#[test]
fn etcd_once_per_across_two_processes_and_max_time_124() {
    with(scenarios::once_per_across_two_processes_and_max_time_124);
}
