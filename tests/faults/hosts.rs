//! "Other hosts" (root, unshare): holders in their own UTS + PID + mount namespaces,
//! with their own host names and /dev/shm, sharing the lock directory with this "host".
//! - A live foreign holder is never broken over ≥ 5 TTLs, although its PID does not exist here
//!   and its host name is even the same as ours (a different PID namespace is another host).
//! - A killed foreign host (the unshare process SIGKILLed: --kill-child takes its namespace down)
//!   is taken over after about a TTL without a heartbeat, never before, although its PID is that
//!   of a live process here (which is never signalled).

use crate::support;

use super::ns;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{LastChange, Proc};

fn prerequisites() -> bool {
    support::need_root() || support::need_tools(&["unshare", "hostname", "mount", "sh", "sleep"])
}

#[test]
fn live_foreign_holder_is_never_broken_over_5_ttls() {
    if prerequisites() {
        return;
    }
    let ttl = Duration::from_millis(400);
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("job.lock");
    let work = tempfile::tempdir().unwrap();
    let me = leasehold::Identity::current();
    // Same host name as ours, a PID that does not exist here: a local PID check would call
    // it dead at once.
    let spec = ns::Spec {
        hold_ms: ttl.as_millis() as u64 * 6,
        ..ns::Spec::new(&lock, work.path(), &me.host, ttl)
    };
    let t0 = Instant::now();
    let mut f = ns::spawn(&spec);
    ns::check_lease_is_foreign(&lock, &f);
    let (mut attempts, mut broken, mut cli_attempts) = (0u64, Vec::new(), 0u64);
    let mut next_cli = Instant::now();
    while f.kid.try_wait().is_none() {
        match ns::contender(&lock, ttl) {
            Err(leasehold::Error::WouldBlock { verdict, .. }) => {
                assert!(
                    !verdict.same_host,
                    "foreign holder judged same-host: {verdict}"
                );
            }
            Ok(g) => {
                // Taking a lease the holder has just released (its hold is over, its namespace
                // still being torn down) is right; breaking it while the holder lives is not.
                if let Some(v) = g.broke()
                    && f.kid.try_wait().is_none()
                    && support::alive(f.kid.pid())
                {
                    broken.push(format!(
                        "at {:?}: broke a live foreign lease: {v}",
                        t0.elapsed()
                    ));
                }
                drop(g);
            }
            Err(e) => panic!("contender: {e}"),
        }
        attempts += 1;
        if Instant::now() >= next_cli {
            let out = Command::new(support::bin())
                .args(["run", "-n", "--ttl", "400ms"])
                .arg(&lock)
                .args(["--", "true"])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // Exit 0 after the holder released (its hold over, its namespace still being torn
            // down) is right; breaking its lease while it lives is not.
            if f.kid.try_wait().is_none()
                && support::alive(f.kid.pid())
                && (err.contains("broke") || !matches!(support::code(out.status), 0 | 75))
            {
                broken.push(format!(
                    "`leasehold run -n` exited {} against a live foreign holder: {}",
                    out.status,
                    err.trim()
                ));
            }
            cli_attempts += 1;
            next_cli = Instant::now() + ttl / 2;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let held = t0.elapsed();
    let st = f.kid.wait_timeout(Duration::from_secs(120));
    assert_eq!(
        support::code(st),
        0,
        "the foreign holder did not finish normally"
    );
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    assert!(held >= ttl * 5, "held only {held:?}");
    println!(
        "faults: other hosts: live foreign holder (same host name, other pid namespace, pid {} absent here) held {} ms = {:.1} TTLs; contender attempts={attempts} cli_attempts={cli_attempts} violations=0",
        f.inner_pid,
        held.as_millis(),
        held.as_secs_f64() / ttl.as_secs_f64()
    );
}

#[test]
fn killed_foreign_host_is_taken_over_after_a_ttl_never_before() {
    if prerequisites() {
        return;
    }
    let ttl = Duration::from_millis(400);
    let trials = support::scaled(4);
    let mut worst_after_kill = Duration::ZERO;
    let mut min_after_last_heartbeat = Duration::MAX;
    for trial in 0..trials {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let work = tempfile::tempdir().unwrap();
        // A live process here whose PID the foreign holder will have in its namespace.
        let mut bystander = Proc::spawn(
            Command::new("sleep").arg("600").stdin(Stdio::null()),
            "bystander",
        );
        let host = format!("faults-remote-{trial}");
        let mut f = ns::spawn(&ns::Spec {
            inner_pid: bystander.pid(),
            ..ns::Spec::new(&lock, work.path(), &host, ttl)
        });
        ns::check_lease_is_foreign(&lock, &f);
        // Contend for one TTL: always refused. Note when each heartbeat is first seen.
        let what = format!("trial {trial}");
        let mut seen = LastChange::new(&lock);
        ns::never_broken(&lock, ttl, ttl, &mut seen, &what);
        // The foreign host dies.
        f.kid.kill();
        let killed = Instant::now();
        let g = ns::take_over(&lock, ttl, killed, &mut seen, &what);
        let took = Instant::now();
        let since_hb = took - seen.at;
        // Our own poll may see a heartbeat up to one loop (a few ms) after the contender did.
        assert!(
            since_hb + Duration::from_millis(20) >= ttl,
            "trial {trial}: taken over {since_hb:?} after the last heartbeat, before the TTL {ttl:?}"
        );
        let broke = g.broke().map(|v| v.to_string()).unwrap_or_default();
        assert!(
            broke.contains("no heartbeat"),
            "trial {trial}: broke for {broke:?}"
        );
        worst_after_kill = worst_after_kill.max(took - killed);
        min_after_last_heartbeat = min_after_last_heartbeat.min(since_hb);
        g.release().unwrap();
        assert!(
            bystander.try_wait().is_none() && support::not_signalled(bystander.pid()),
            "trial {trial}: the local process with the foreign holder's PID was signalled"
        );
        bystander.kill();
    }
    println!(
        "faults: other hosts: killed foreign host taken over: trials={trials} violations=0 ttl_ms={} worst_takeover_after_kill_ms={} earliest_takeover_after_last_heartbeat_ms={} (bystander with the same PID here never signalled)",
        ttl.as_millis(),
        worst_after_kill.as_millis(),
        min_after_last_heartbeat.as_millis()
    );
}
