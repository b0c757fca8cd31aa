//! `leasehold run --shared` and `--slots N` through the real binary: a waiting exclusive holder
//! is not overtaken by later shared arrivals; settings that disagree are refused (64, naming
//! both); one dead holder of three is cleaned up without touching the other two; `status`
//! lists every holder (`--json`: a `holders` array); `break --lease-id` stops exactly one
//! holder and `break` alone breaks none that is live; a LOCK in a newer format is refused.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;

/// A `leasehold run FLAGS LOCK` whose command writes `DIR/entered-ID` and runs until
/// `DIR/release-ID` exists.
struct Job {
    kid: Proc,
    dir: PathBuf,
    id: String,
}

impl Job {
    fn start(lock: &Path, flags: &[&str], id: &str) -> Job {
        let dir = lock.parent().expect("dir").to_path_buf();
        let script = format!(
            "touch '{d}/entered-{id}'; while [ ! -e '{d}/release-{id}' ]; do sleep 0.02; done",
            d = dir.display()
        );
        let kid = run_sh(lock, flags, &script, &format!("job {id}"));
        Job {
            kid,
            dir,
            id: id.into(),
        }
    }

    fn entered(&self) -> bool {
        self.dir.join(format!("entered-{}", self.id)).exists()
    }

    #[track_caller]
    fn wait_entered(&self) {
        ensure_within(
            &format!("job {} to enter", self.id),
            Duration::from_secs(10),
            || self.entered(),
        );
    }

    /// Lets the command finish; returns the wrapper's exit code.
    fn finish(&mut self) -> i32 {
        fs::write(self.dir.join(format!("release-{}", self.id)), "").expect("release");
        code(self.kid.wait_timeout(Duration::from_secs(10)))
    }
}

fn status_json(lock: &Path) -> serde_json::Value {
    let out = lh()
        .args(["status", "--json"])
        .arg(lock)
        .output()
        .expect("status");
    assert!(out.status.success(), "status failed: {out:?}");
    serde_json::from_slice(&out.stdout).expect("status --json parses")
}

fn queued(lock: &Path) -> usize {
    status_json(lock)["queue"].as_array().map_or(0, |q| q.len())
}

/// `(lease_id, token, heartbeat_seq)` of every holder `status --json` lists.
fn holders(lock: &Path) -> Vec<(String, u64, u64)> {
    status_json(lock)["holders"]
        .as_array()
        .expect("a holders array")
        .iter()
        .map(|h| {
            (
                h["lease_id"].as_str().expect("lease_id").to_string(),
                h["token"].as_u64().expect("token"),
                h["heartbeat_seq"].as_u64().expect("heartbeat_seq"),
            )
        })
        .collect()
}

#[test]
fn a_waiting_exclusive_holder_is_not_overtaken_by_later_shared_arrivals() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("rw.lock");
    let mut s1 = Job::start(&lock, &["--shared"], "s1");
    s1.wait_entered();
    // A second shared holder joins at once: shared holders hold together.
    let mut s0 = Job::start(&lock, &["--shared"], "s0");
    s0.wait_entered();
    let mut x = Job::start(&lock, &[], "x");
    ensure_within(
        "the exclusive job to queue",
        Duration::from_secs(10),
        || queued(&lock) == 1,
    );
    let mut s2 = Job::start(&lock, &["--shared"], "s2");
    ensure_within(
        "the later shared job to queue",
        Duration::from_secs(10),
        || queued(&lock) == 2,
    );
    assert!(!x.entered(), "the exclusive job ran beside shared holders");
    assert!(
        !s2.entered(),
        "a later shared arrival overtook the waiting exclusive job"
    );
    assert_eq!(s0.finish(), 0);
    assert_eq!(s1.finish(), 0);
    x.wait_entered();
    // The shared job behind it still waits: the exclusive holder excludes all.
    assert_eq!(queued(&lock), 1);
    assert!(
        !s2.entered(),
        "a shared job ran beside the exclusive holder"
    );
    assert_eq!(x.finish(), 0);
    s2.wait_entered();
    assert_eq!(s2.finish(), 0);
}

#[test]
fn settings_that_disagree_are_refused_with_64_naming_both() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("sem.lock");
    let mut h = Job::start(&lock, &["--slots", "2"], "h");
    h.wait_entered();
    for (flags, asked) in [
        (&["-n", "--slots", "3"][..], "--slots 3"),
        (&["-n"][..], "plain"),
        (&["-n", "--shared"][..], "--shared"),
        // A waiter is refused too, at once rather than when its turn comes.
        (&["-w", "5s", "--slots", "1"][..], "--slots 1"),
    ] {
        lh_assert()
            .arg("run")
            .args(flags)
            .arg(&lock)
            .args(["--", "touch"])
            .arg(d.path().join("must-not-run"))
            .timeout(Duration::from_secs(3))
            .assert()
            .code(64)
            .stderr_has("--slots 2")
            .stderr_has(asked);
    }
    assert!(!d.path().join("must-not-run").exists());
    assert_eq!(h.finish(), 0);
    // Nobody holds it now: a new setting may take over.
    lh_assert()
        .args(["run", "-n", "--slots", "3"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(0);
}

/// The flags of [`three_slot_holders`].
const THREE_SLOTS: [&str; 4] = ["--slots", "3", "--ttl", "1s"];

/// `leasehold run -n --slots 3 --ttl 1s LOCK -- true`: one more holder, if a slot is free.
fn one_more_slot(lock: &Path) -> assert_cmd::assert::Assert {
    lh_assert()
        .args(["run", "-n"])
        .args(THREE_SLOTS)
        .arg(lock)
        .args(["--", "true"])
        .assert()
}

/// Three `run --slots 3 --ttl 1s` holders of LOCK (a, b, c), each inside its section.
fn three_slot_holders(lock: &Path) -> Vec<Job> {
    ["a", "b", "c"]
        .iter()
        .map(|id| {
            let j = Job::start(lock, &THREE_SLOTS, id);
            j.wait_entered();
            j
        })
        .collect()
}

#[test]
fn one_dead_holder_of_three_is_cleaned_up_without_touching_the_others() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("three.lock");
    let mut jobs = three_slot_holders(&lock);
    let before = holders(&lock);
    assert_eq!(before.len(), 3);
    // Every slot held: a fourth is refused.
    one_more_slot(&lock).code(75);
    // SIGKILL b's wrapper: its command dies with it (PDEATHSIG). `break` alone breaks it (it
    // is stale) and nobody else.
    let b_pid = jobs[1].kid.pid();
    let dead = jobs[1].kid.kill();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&dead),
        Some(9)
    );
    // Its command dies by PDEATHSIG a moment later; until then b is not stale yet.
    ensure_within(
        "b's holder to be judged stale",
        Duration::from_secs(10),
        || {
            status_json(&lock)["holders"]
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| h["state"] == "stale"))
        },
    );
    lh_assert()
        .arg("break")
        .arg(&lock)
        .assert()
        .code(0)
        .stderr_has(&format!("broke stale lease of pid {b_pid}"));
    let b_file = d.path().join(".three.lock.leasehold-slot-1");
    let b: serde_json::Value = serde_json::from_slice(&fs::read(&b_file).unwrap()).unwrap();
    assert_eq!(b["lease_id"], before[1].0.as_str());
    assert_eq!(b["state"], "released");
    assert!(
        b["ended"]["how"].as_str().unwrap().starts_with("broken: "),
        "{b}"
    );
    let key = |v: &[(String, u64, u64)]| v.iter().map(|h| (h.0.clone(), h.1)).collect::<Vec<_>>();
    let untouched = |v: &[(String, u64, u64)], want: &[usize]| {
        assert_eq!(
            key(v),
            want.iter()
                .map(|i| (before[*i].0.clone(), before[*i].1))
                .collect::<Vec<_>>(),
            "the live holders' leases changed"
        )
    };
    untouched(&holders(&lock), &[0, 2]);
    // SIGKILL c's wrapper: a newcomer gets a place at once (its attempt cleans c up), and a
    // is not touched.
    jobs[2].kid.kill();
    // As for b: its command dies by PDEATHSIG a moment later, and only then is c stale (an
    // attempt that came first would take b's freed place and leave c for later).
    ensure_within(
        "c's holder to be judged stale",
        Duration::from_secs(10),
        || {
            status_json(&lock)["holders"]
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| h["state"] == "stale"))
        },
    );
    one_more_slot(&lock).code(0);
    untouched(&holders(&lock), &[0]);
    // a keeps renewing, and keeps running.
    ensure_within("the live holder to renew", Duration::from_secs(5), || {
        holders(&lock)[0].2 > before[0].2
    });
    assert!(jobs[0].kid.try_wait().is_none());
    assert_eq!(jobs[0].finish(), 0);
}

#[test]
fn status_lists_every_holder_and_break_by_lease_id_stops_exactly_one() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("list.lock");
    let mut jobs = three_slot_holders(&lock);
    let v = status_json(&lock);
    assert_eq!(v["state"], "held");
    assert_eq!(v["mode"]["slots"], 3);
    let hs = holders(&lock);
    assert_eq!(hs.len(), 3, "{v}");
    let mut tokens: Vec<u64> = hs.iter().map(|h| h.1).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "tokens not distinct: {v}");
    let text = lh_assert().arg("status").arg(&lock).assert().code(0);
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    for (n, h) in hs.iter().enumerate() {
        assert!(text.contains(&format!("holder {}:", n + 1)), "{text}");
        assert!(text.contains(&h.0), "{text}");
    }
    // `break` alone breaks only stale holders: none here.
    lh_assert()
        .arg("break")
        .arg(&lock)
        .assert()
        .code(75)
        .stderr_has("none stale");
    assert_eq!(holders(&lock).len(), 3);
    // By lease id: exactly that holder is revoked, and its wrapper fences its command (74).
    lh_assert()
        .args(["break", "--lease-id", &hs[1].0])
        .arg(&lock)
        .assert()
        .code(0)
        .stderr_has("revoked");
    let st = jobs[1].kid.wait_timeout(Duration::from_secs(10));
    assert_eq!(code(st), 74, "the broken holder was not fenced");
    assert!(jobs[0].kid.try_wait().is_none() && jobs[2].kid.try_wait().is_none());
    let left: Vec<String> = holders(&lock).into_iter().map(|h| h.0).collect();
    assert!(!left.contains(&hs[1].0));
    assert!(
        left.contains(&hs[0].0) && left.contains(&hs[2].0),
        "{left:?}"
    );
    assert_eq!(jobs[0].finish(), 0);
    assert_eq!(jobs[2].finish(), 0);
}

#[test]
fn a_shared_lock_is_written_in_format_2_and_a_newer_format_is_refused_untouched() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("fmt.lock");
    lh_assert()
        .args(["run", "--shared"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .code(0);
    let bytes = fs::read(&lock).unwrap();
    assert!(bytes.starts_with(b"{\n  \"leasehold\": 2,"));
    // A plain lock keeps format 1.
    let plain = d.path().join("plain.lock");
    lh_assert()
        .arg("run")
        .arg(&plain)
        .args(["--", "true"])
        .assert()
        .code(0);
    assert!(
        fs::read(&plain)
            .unwrap()
            .starts_with(b"{\n  \"leasehold\": 1,")
    );
    // Format 3 (from a leasehold newer than this one): refused with 65, file untouched.
    let newer =
        String::from_utf8(bytes)
            .unwrap()
            .replacen("\"leasehold\": 2,", "\"leasehold\": 3,", 1);
    fs::write(&lock, &newer).unwrap();
    for args in [
        &["status"][..],
        &["run", "-n", "--shared"][..],
        &["run", "-n"][..],
    ] {
        let mut c = lh_assert();
        c.args(args).arg(&lock);
        if args[0] == "run" {
            c.args(["--", "true"]);
        }
        c.assert().code(65).stderr_has("format");
    }
    assert_eq!(fs::read_to_string(&lock).unwrap(), newer);
}
