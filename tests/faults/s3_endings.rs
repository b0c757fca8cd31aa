//! The lock remembers how the last holding ended on S3 (issue 30, PROTOCOL.md §15
//! *Endings*): `store_endings.rs`'s scenarios on a real Ceph RADOS Gateway. Run as
//! `s3::endings::`.

use crate::support::s3::gateway;

use crate::store_endings as scenarios;
use scenarios::On;

fn with(f: impl FnOnce(&On<'_>)) {
    let Some(gw) = gateway() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let cmd = || gw.cmd();
    let url = |name: &str| gw.url(name);
    f(&On {
        cmd: &cmd,
        url: &url,
        dir: tmp.path().to_path_buf(),
    });
}

#[test]
fn s3_previous_is_released_3_died_fenced_and_broken() {
    // A SIGKILLed holder on this host is judged dead at once: its TTL is not waited out.
    with(|on| scenarios::previous_is_released_3_died_fenced_and_broken(on, "30s"));
}

#[test]
fn s3_after_crash_fail_refuses_until_ack_and_recover_runs_only_after_unclean_endings() {
    with(scenarios::after_crash_fail_until_ack_and_recover);
}

#[test]
fn s3_once_per_across_two_processes_and_max_time_124() {
    with(scenarios::once_per_across_two_processes_and_max_time_124);
}
