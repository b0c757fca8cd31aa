//! `--shared` and `--slots N` on S3 (`s3::shared::`): every holder's record in the lock's one
//! object, every change one conditional write of it (PROTOCOL.md §15, *Shared leases and
//! slots*). On the real gateway: two slots held and a third refused, settings that disagree
//! refused, `status --json` listing the holders; contenders under contention never more than
//! N inside, and readers and writers never a writer beside anyone; a forced break fences
//! every shared holder.

use std::fs;
use std::process::Command;
use std::time::Duration;

use super::{held, let_go, out};
use crate::support::s3::{Gateway, gateway};
use crate::support::{self, Proc, code, rw_outcome, rw_script, slot_outcome, slot_script};

fn status_json(gw: &Gateway, url: &str) -> serde_json::Value {
    let (rc, o, err) = out(gw, &["status", "--json", url]);
    assert!(rc == 0 || rc == 1, "status exited {rc}: {err}");
    serde_json::from_str(&o).unwrap_or_else(|e| panic!("status --json: {e}: {o}"))
}

#[test]
fn s3_slots_2_admit_two_refuse_a_third_and_under_contention_never_three() {
    let Some(gw) = gateway() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let url = gw.url("sem");
    // Deterministically: two holders inside together, a third refused, and status lists both.
    let mut a = held(gw.cmd(), &url, &["--slots", "2"], dir, "a");
    let mut b = held(gw.cmd(), &url, &["--slots", "2"], dir, "b");
    let (rc, _, err) = out(gw, &["run", "-n", "--slots", "2", &url, "--", "true"]);
    assert_eq!(rc, 75, "a third of two slots: {err}");
    let (rc, _, err) = out(gw, &["run", "-n", "--slots", "3", &url, "--", "true"]);
    assert_eq!(rc, 64, "another number of slots: {err}");
    let (rc, _, err) = out(gw, &["run", "-n", &url, "--", "true"]);
    assert_eq!(rc, 64, "a plain run on a counted lock: {err}");
    let v = status_json(gw, &url);
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(2), "{v:#}");
    for (n, p) in [("a", &mut a), ("b", &mut b)] {
        let_go(dir, n);
        assert!(p.wait_timeout(Duration::from_secs(30)).success());
    }
    let (rc, _, err) = out(gw, &["run", "-n", &url, "--", "true"]);
    assert_eq!(rc, 0, "a plain run once the slots are free: {err}");
    // Under contention: 4 contenders, several rounds each.
    let rounds = contend(gw, "s3-slots", |c, id, _| {
        c.args(["--slots", "2", "-w", "120", &url, "--", "sh", "-c"])
            .arg(slot_script(dir, id));
    });
    let two = slot_outcome(dir, 4 * rounds);
    println!(
        "s3 --slots 2: {} runs by 4 contenders, two inside together {two} times, never three",
        4 * rounds
    );
}

/// Runs 4 contenders, each `leasehold run` several rounds in a row, `args` adding each run's
/// arguments after `run` (with the run's id and a generator seeded by `seed` and the
/// contender); every run must succeed. Returns the rounds each contender made.
fn contend(
    gw: &Gateway,
    seed: &str,
    args: impl Fn(&mut Command, &str, &mut support::Rng) + Sync,
) -> usize {
    let rounds = support::scaled(6).max(3);
    std::thread::scope(|s| {
        for w in 0..4 {
            let args = &args;
            s.spawn(move || {
                let mut rng = support::Rng::new(&format!("{seed}-{w}"));
                for r in 0..rounds {
                    let id = format!("w{w}.{r}");
                    let mut c = gw.cmd();
                    c.arg("run");
                    args(&mut c, &id, &mut rng);
                    let shown = format!("{c:?}");
                    let mut p = Proc::spawn(c, "leasehold run (contention)");
                    let st = p.wait_timeout(Duration::from_secs(150));
                    assert!(st.success(), "{id}: {st}: {}: {shown}", p.stderr());
                }
            });
        }
    });
    rounds
}

#[test]
fn s3_shared_and_exclusive_contenders_under_contention_never_overlap_a_writer() {
    let Some(gw) = gateway() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fs::create_dir(dir.join("r")).unwrap();
    let url = gw.url("rwc");
    let rounds = contend(gw, "s3-rw", |c, id, rng| {
        // A quarter of the acquisitions exclusive.
        let exclusive = rng.chance(25);
        if !exclusive {
            c.arg("--shared");
        }
        c.args(["-w", "120", &url, "--", "sh", "-c"])
            .arg(rw_script(dir, id, exclusive));
    });
    let n = 4 * rounds;
    let (writers, together) = rw_outcome(dir, n);
    println!(
        "s3 readers-writer: {n} runs by 4 contenders ({writers} exclusive), readers together \
         {together} times, no writer beside anyone"
    );
}

#[test]
fn s3_two_shared_holders_together_and_a_forced_break_fences_both() {
    let Some(gw) = gateway() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let url = gw.url("sbrk");
    let flags = ["--shared", "--ttl", "10", "--heartbeat", "500ms"];
    let mut a = held(gw.cmd(), &url, &flags, dir, "a");
    let mut b = held(gw.cmd(), &url, &flags, dir, "b");
    // Both renew their own records in the one object for a few heartbeats, neither losing.
    std::thread::sleep(Duration::from_secs(2));
    let v = status_json(gw, &url);
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(2), "{v:#}");
    let (rc, _, err) = out(gw, &["run", "-n", &url, "--", "true"]);
    assert_eq!(rc, 75, "an exclusive run beside shared holders: {err}");
    let (rc, _, err) = out(gw, &["break", "--force", &url]);
    assert_eq!(rc, 0, "break --force: {err}");
    for (n, p) in [("a", &mut a), ("b", &mut b)] {
        assert_eq!(
            code(p.wait_timeout(Duration::from_secs(20))),
            74,
            "{n} fences after the break: {}",
            p.stderr()
        );
    }
    let (rc, _, err) = out(gw, &["run", "-n", &url, "--", "true"]);
    assert_eq!(rc, 0, "free once every holder fenced: {err}");
}
