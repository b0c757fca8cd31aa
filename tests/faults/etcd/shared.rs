//! `--shared` and `--slots N` on an etcd lock, on the real three-member cluster: shared holders
//! run together while an exclusive contender waits and then runs alone; an exclusive holder
//! (leasehold's or `etcdctl lock`'s) keeps shared contenders out; `--slots 2` under contention
//! never admits a third and does admit two; shared and exclusive contenders mixed under
//! contention never put a writer beside anyone; a SIGKILLed slot holder's slot frees within
//! its TTL, after its command died; `status` lists every holder; `break` takes the holders its
//! mode names. Overlap and exclusion are proved with files each command creates
//! (O_EXCL, mkdir), never with sleeps.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::{held, let_go, lh_out, mkfifo, sigkill};
use crate::support::etcd::Cluster;
use crate::support::{self, Proc, code, ensure_within, lh};

/// `status --json` of `url`, parsed.
fn status_json(url: &str) -> serde_json::Value {
    let (rc, out, err) = lh_out(&["status", "--json", url]);
    assert!(rc == 0 || rc == 1, "status exited {rc}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
}

/// A `leasehold run` (with `flags`) whose command checks that nobody is inside (no `in-*` file
/// in `dir`; else it leaves `violation-NAME`), marks `in-NAME`, and blocks until `go-NAME` is
/// written. Not waited for: it may be queued.
fn exclusive_check(url: &str, flags: &[&str], dir: &Path, name: &str) -> Proc {
    let go = dir.join(format!("go-{name}"));
    mkfifo(&go);
    let script = format!(
        "for f in {d}/in-*; do [ -e \"$f\" ] && echo \"$f\" >> {d}/violation-{name}; done; \
         touch {d}/in-{name}; read x < {go}; rm {d}/in-{name}",
        d = dir.display(),
        go = go.display()
    );
    let mut c = lh();
    c.arg("run")
        .args(flags)
        .args([url, "--", "sh", "-c", &script]);
    Proc::spawn(c, "leasehold run (exclusive, checking)")
}

#[test]
fn etcd_shared_holders_run_together_while_an_exclusive_contender_waits_then_runs_alone() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    let url = cl.url("rw");
    // Three shared holders: each command starts while the others' commands are still inside
    // (each blocks on its FIFO until let go), so all three are inside together.
    let mut shared: Vec<Proc> = (0..3)
        .map(|i| held(&url, &["--shared"], &dir, &format!("s{i}")))
        .collect();
    for i in 0..3 {
        assert!(dir.join(format!("in-s{i}")).exists(), "s{i} is inside");
    }
    let v = status_json(&url);
    assert_eq!(v["state"], "held", "{v:#}");
    assert_eq!(v["mode"]["shared"], true, "{v:#}");
    let holders = v["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 3, "status lists the three holders: {v:#}");
    let mut pids: Vec<i64> = holders.iter().map(|h| h["pid"].as_i64().unwrap()).collect();
    pids.sort();
    let mut want: Vec<i64> = shared.iter().map(|p| i64::from(p.pid())).collect();
    want.sort();
    assert_eq!(pids, want, "the holders are the three shared runs: {v:#}");
    let tokens: std::collections::HashSet<u64> = holders
        .iter()
        .map(|h| h["token"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens.len(), 3, "each holder has a token of its own: {v:#}");
    // The readable status says the mode and each holder.
    let (_, text, _) = lh_out(&["status", &url]);
    assert!(
        text.contains("--shared (3 holder(s))") && text.matches("holder ").count() >= 3,
        "{text}"
    );
    // An exclusive contender is refused at once, and queues with -w.
    let (rc, _, err) = lh_out(&["run", "-n", &url, "--", "true"]);
    assert_eq!(rc, 75, "an exclusive -n behind shared holders: {err}");
    let mut x = exclusive_check(&url, &["-w", "60"], &dir, "x");
    ensure_within(
        "the exclusive contender to queue",
        Duration::from_secs(20),
        || cl.keys("rw/").len() == 4,
    );
    // A shared newcomer does not overtake the waiting exclusive one (FIFO).
    let (rc, _, err) = lh_out(&["run", "-n", "--shared", &url, "--", "true"]);
    assert_eq!(
        rc, 75,
        "a shared -n behind a waiting exclusive contender: {err}"
    );
    // The shared holders leave one by one; the exclusive one enters only after the last.
    for (i, s) in shared.iter_mut().enumerate() {
        assert!(
            !dir.join("in-x").exists(),
            "x entered beside a shared holder"
        );
        let_go(&dir, &format!("s{i}"));
        assert!(s.wait_timeout(Duration::from_secs(30)).success());
    }
    ensure_within(
        "the exclusive contender to run",
        Duration::from_secs(20),
        || dir.join("in-x").exists(),
    );
    assert!(
        !dir.join("violation-x").exists(),
        "the exclusive command started beside: {}",
        fs::read_to_string(dir.join("violation-x")).unwrap_or_default()
    );
    // Alone: a shared contender is refused while it holds.
    let (rc, _, err) = lh_out(&["run", "-n", "--shared", &url, "--", "true"]);
    assert_eq!(rc, 75, "a shared -n beside an exclusive holder: {err}");
    let_go(&dir, "x");
    assert!(x.wait_timeout(Duration::from_secs(30)).success());
    assert!(cl.keys("rw/").is_empty(), "every key left the line");
}

#[test]
fn etcd_an_exclusive_holder_keeps_shared_contenders_out_and_slots_are_refused_as_a_mismatch() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    let url = cl.url("wx");
    let mut h = held(&url, &[], &dir, "h");
    for _ in 0..3 {
        let (rc, _, err) = lh_out(&["run", "-n", "--shared", &url, "--", "true"]);
        assert_eq!(rc, 75, "a shared -n beside an exclusive holder: {err}");
    }
    // As on files: a counted contender on a plain lock in use is a usage error.
    let (rc, _, err) = lh_out(&["run", "-n", "--slots", "2", &url, "--", "true"]);
    assert_eq!(rc, 64, "--slots on a plain lock in use: {err}");
    assert!(err.contains("--slots 2") && err.contains("plain"), "{err}");
    // Two shared contenders queue; they run (together) only after the holder has let go.
    let mut s: Vec<Proc> = (0..2)
        .map(|i| exclusive_like_shared(&url, &dir, &format!("r{i}")))
        .collect();
    ensure_within(
        "the shared contenders to queue",
        Duration::from_secs(20),
        || cl.keys("wx/").len() == 3,
    );
    assert!(!dir.join("in-r0").exists() && !dir.join("in-r1").exists());
    let_go(&dir, "h");
    assert!(h.wait_timeout(Duration::from_secs(30)).success());
    ensure_within(
        "both shared contenders inside together",
        Duration::from_secs(20),
        || dir.join("in-r0").exists() && dir.join("in-r1").exists(),
    );
    for (i, p) in s.iter_mut().enumerate() {
        let_go(&dir, &format!("r{i}"));
        assert!(p.wait_timeout(Duration::from_secs(30)).success());
    }
    for i in 0..2 {
        assert!(
            !dir.join(format!("violation-r{i}")).exists(),
            "r{i} started while the exclusive holder was inside"
        );
    }
}

/// A `--shared -w 60` run whose command checks that no exclusive holder is inside (`in-h`),
/// marks `in-NAME` and blocks until let go.
fn exclusive_like_shared(url: &str, dir: &Path, name: &str) -> Proc {
    let go = dir.join(format!("go-{name}"));
    mkfifo(&go);
    let script = format!(
        "[ -e {d}/in-h ] && touch {d}/violation-{name}; touch {d}/in-{name}; read x < {go}; \
         rm {d}/in-{name}",
        d = dir.display(),
        go = go.display()
    );
    let mut c = lh();
    c.args([
        "run", "--shared", "-w", "60", url, "--", "sh", "-c", &script,
    ]);
    Proc::spawn(c, "leasehold run --shared (queued)")
}

#[test]
fn etcd_an_etcdctl_lock_holder_keeps_shared_contenders_out() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    let url = cl.url("ctl");
    let go = dir.join("go-e");
    mkfifo(&go);
    let script = format!(
        "touch {d}/in-h; read x < {g}; rm {d}/in-h",
        d = dir.display(),
        g = go.display()
    );
    let mut e = Proc::spawn(
        {
            let mut c = cl.etcdctl();
            c.args(["lock", "ctl", "--", "timeout", "60", "sh", "-c", &script]);
            c
        },
        "etcdctl lock",
    );
    ensure_within("etcdctl to hold", Duration::from_secs(20), || {
        dir.join("in-h").exists()
    });
    let (rc, _, err) = lh_out(&["run", "-n", "--shared", &url, "--", "true"]);
    assert_eq!(rc, 75, "a shared -n while etcdctl lock holds: {err}");
    assert!(
        err.contains("etcdctl lock holder"),
        "names the holder: {err}"
    );
    let mut s = exclusive_like_shared(&url, &dir, "r0");
    ensure_within(
        "the shared contender to queue",
        Duration::from_secs(20),
        || cl.keys("ctl/").len() == 2,
    );
    assert!(!dir.join("in-r0").exists(), "shared ran while etcdctl held");
    fs::write(&go, "go\n").unwrap();
    assert!(e.wait_timeout(Duration::from_secs(30)).success());
    ensure_within(
        "the shared contender to run",
        Duration::from_secs(20),
        || dir.join("in-r0").exists(),
    );
    // And etcdctl lock waits behind the shared holder (its key counts as ahead).
    let check = format!("test ! -e {d}/in-r0 && touch {d}/e-ran", d = dir.display());
    let mut e2 = Proc::spawn(
        {
            let mut c = cl.etcdctl();
            c.args(["lock", "ctl", "--", "sh", "-c", &check]);
            c
        },
        "etcdctl lock behind a shared holder",
    );
    ensure_within("etcdctl to queue", Duration::from_secs(20), || {
        cl.keys("ctl/").len() == 2
    });
    assert!(
        !dir.join("e-ran").exists(),
        "etcdctl ran beside a shared holder"
    );
    let_go(&dir, "r0");
    assert!(s.wait_timeout(Duration::from_secs(30)).success());
    assert!(e2.wait_timeout(Duration::from_secs(30)).success());
    assert!(dir.join("e-ran").exists());
    assert!(
        !dir.join("violation-r0").exists(),
        "shared ran beside etcdctl"
    );
}

#[test]
fn etcd_slots_2_under_contention_never_admits_a_third_and_does_admit_two() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    let url = cl.url("sem");
    // Deterministically: two holders inside together, a third refused, and status lists both.
    let mut a = held(&url, &["--slots", "2"], &dir, "a");
    let mut b = held(&url, &["--slots", "2"], &dir, "b");
    let (rc, _, err) = lh_out(&["run", "-n", "--slots", "2", &url, "--", "true"]);
    assert_eq!(rc, 75, "a third of two slots: {err}");
    let (rc, _, err) = lh_out(&["run", "-n", "--slots", "3", &url, "--", "true"]);
    assert_eq!(rc, 64, "another number of slots: {err}");
    let (rc, _, err) = lh_out(&["run", "-n", "--shared", &url, "--", "true"]);
    assert_eq!(rc, 64, "--shared on a counted lock: {err}");
    let v = status_json(&url);
    assert_eq!(v["mode"]["slots"], 2, "{v:#}");
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(2), "{v:#}");
    let (_, text, _) = lh_out(&["status", &url]);
    assert!(text.contains("--slots 2 (2 holder(s))"), "{text}");
    for (n, p) in [("a", &mut a), ("b", &mut b)] {
        let_go(&dir, n);
        assert!(p.wait_timeout(Duration::from_secs(30)).success());
    }
    // Under contention: 5 contenders, several rounds each.
    let rounds = support::scaled(40).max(4);
    std::thread::scope(|s| {
        for w in 0..5 {
            let (url, dir) = (&url, &dir);
            s.spawn(move || {
                for r in 0..rounds {
                    let id = format!("w{w}.{r}");
                    let mut c = lh();
                    c.args(["run", "--slots", "2", "-w", "120", url, "--", "sh", "-c"])
                        .arg(support::slot_script(dir, &id));
                    let st = Proc::spawn(c, "leasehold run --slots 2")
                        .wait_timeout(Duration::from_secs(150));
                    assert!(st.success(), "{id}: {st}");
                }
            });
        }
    });
    let runs = 5 * rounds;
    let two = support::slot_outcome(&dir, runs);
    assert!(two > 0, "never two inside together in {runs} runs");
    println!(
        "etcd --slots 2: {runs} runs by 5 contenders, two inside together {two} times, never three"
    );
    assert!(cl.keys("sem/").is_empty(), "every key left the line");
}

#[test]
fn etcd_break_of_a_shared_lock_takes_exactly_the_holders_its_mode_names() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    let url = cl.url("sbrk");
    let flags = ["--shared", "--ttl", "30", "--heartbeat", "500ms"];
    let mut a = held(&url, &flags, &dir, "a");
    let mut b = held(&url, &flags, &dir, "b");
    let v = status_json(&url);
    let id_of = |pid: i32| {
        v["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["pid"].as_i64() == Some(i64::from(pid)))
            .and_then(|h| h["lease_id"].as_str())
            .unwrap_or_else(|| panic!("no holder pid {pid}: {v:#}"))
            .to_string()
    };
    let (id_a, id_b) = (id_of(a.pid()), id_of(b.pid()));
    // Without options: no holder is stale, none is broken, and the refusal names them.
    let (rc, _, err) = lh_out(&["break", &url]);
    assert_eq!(rc, 75, "{err}");
    assert!(err.contains(&id_a) && err.contains(&id_b), "{err}");
    // By lease id: exactly that holder fences (74); the other runs on.
    let (rc, _, err) = lh_out(&["break", "--lease-id", &id_a, &url]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        code(a.wait_timeout(Duration::from_secs(10))),
        74,
        "a fences"
    );
    assert!(dir.join("in-b").exists(), "b still inside");
    let v = status_json(&url);
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(1), "{v:#}");
    assert_eq!(v["holders"][0]["lease_id"].as_str(), Some(id_b.as_str()));
    assert_eq!(
        v["holders"][0]["lease_state"], "held",
        "b not broken: {v:#}"
    );
    // A dead shared holder is stale, and broken without options; b is not touched.
    let mut d = held(&url, &["--shared", "--ttl", "30"], &dir, "d");
    sigkill(d.pid());
    d.wait_timeout(Duration::from_secs(10));
    ensure_within(
        "the dead holder to be judged stale",
        Duration::from_secs(10),
        || {
            status_json(&url)["holders"]
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| h["state"] == "stale"))
        },
    );
    let (rc, _, err) = lh_out(&["break", &url]);
    assert_eq!(
        rc, 0,
        "a stale shared holder is broken without options: {err}"
    );
    let v = status_json(&url);
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(1), "{v:#}");
    assert_eq!(v["holders"][0]["lease_id"].as_str(), Some(id_b.as_str()));
    // By force: every holder.
    let (rc, _, err) = lh_out(&["break", "--force", &url]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        code(b.wait_timeout(Duration::from_secs(10))),
        74,
        "b fences"
    );
    let (rc, _, err) = lh_out(&["run", "-n", &url, "--", "true"]);
    assert_eq!(rc, 0, "free once every holder fenced: {err}");
}

#[test]
fn etcd_shared_and_exclusive_contenders_under_contention_never_overlap_a_writer() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    fs::create_dir(dir.join("r")).unwrap();
    let url = cl.url("rwc");
    let rounds = support::scaled(30).max(4);
    std::thread::scope(|s| {
        for w in 0..5 {
            let (url, dir) = (&url, &dir);
            s.spawn(move || {
                let mut rng = support::Rng::new(&format!("etcd-rw-{w}"));
                for r in 0..rounds {
                    let id = format!("w{w}.{r}");
                    // A quarter of the acquisitions exclusive.
                    let exclusive = rng.chance(25);
                    let mut c = lh();
                    c.arg("run");
                    if !exclusive {
                        c.arg("--shared");
                    }
                    c.args(["-w", "120", url, "--", "sh", "-c"])
                        .arg(support::rw_script(dir, &id, exclusive));
                    let st = Proc::spawn(c, "leasehold run (readers-writer)")
                        .wait_timeout(Duration::from_secs(150));
                    assert!(st.success(), "{id}: {st}");
                }
            });
        }
    });
    let n = 5 * rounds;
    let (writers, together) = support::rw_outcome(&dir, n);
    assert!(writers > 0, "no exclusive run in {n}");
    assert!(
        together > 0,
        "never two shared holders together in {n} runs"
    );
    println!(
        "etcd readers-writer: {n} runs by 5 contenders ({writers} exclusive), readers together \
         {together} times, no writer beside anyone"
    );
    assert!(cl.keys("rwc/").is_empty(), "every key left the line");
}

#[test]
fn etcd_a_sigkilled_slot_holder_frees_its_slot_within_its_ttl_and_only_after_its_command_died() {
    let Some(cl) = Cluster::start() else { return };
    let dir = cl.path();
    let url = cl.url("skill");
    let flags = ["--slots", "2", "--ttl", "2", "--heartbeat", "500ms"];
    let a = held(&url, &flags, &dir, "a");
    let mut b = held(&url, &flags, &dir, "b");
    let v = status_json(&url);
    let child = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"].as_i64() == Some(i64::from(a.pid())))
        .and_then(|h| h["child_pid"].as_i64())
        .unwrap_or_else(|| panic!("a's command: {v:#}")) as i32;
    // A third waits; its command records whether a's command still lived when it started.
    let check = format!(
        "if [ -e /proc/{child}/stat ] && ! grep -q ') Z' /proc/{child}/stat; then \
         touch {d}/violation; fi; touch {d}/in-c",
        d = dir.display()
    );
    let mut c = lh();
    c.args([
        "run", "--slots", "2", "-w", "30", &url, "--", "sh", "-c", &check,
    ]);
    let mut c = Proc::spawn(c, "leasehold run --slots 2 (third)");
    ensure_within("the third to queue", Duration::from_secs(20), || {
        cl.keys("skill/").len() == 3
    });
    assert!(!dir.join("in-c").exists(), "a third of two slots ran");
    let t0 = std::time::Instant::now();
    super::sigkill(a.pid());
    assert!(c.wait_timeout(Duration::from_secs(20)).success());
    assert!(dir.join("in-c").exists());
    assert!(
        !dir.join("violation").exists(),
        "the third started while the killed holder's command lived"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(3500),
        "the slot freed {:?} after the kill (TTL 2 s)",
        t0.elapsed()
    );
    assert!(dir.join("in-b").exists(), "b held on meanwhile");
    let_go(&dir, "b");
    assert!(b.wait_timeout(Duration::from_secs(20)).success());
}
