//! `run --json`: one JSON object a line on stderr per event (docs/json.md), stdout left to the
//! command: on a free lock (acquired, released), a held lock with -n (refused, exit 75), a wait
//! then the lock (waiting, acquired, released), a fence (fenced, exit 74), a stale lease broken
//! (broke), a command that cannot start (not-started), a --once-per refusal after the lease was
//! taken (refused, then a skipped release), --max-time (timed-out) and a command that leaves a
//! process behind (leftovers-stopped). Every stderr line must parse, carry the
//! event's name and the fields docs/json.md promises, and nothing else may be on stderr.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use serde_json::Value;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Fields every event has (docs/json.md): `event`, `at`, `lock`, `message`.
const COMMON: [&str; 4] = ["event", "at", "lock", "message"];

/// Parses one stderr line as an event: a JSON object with the common fields, and the fields
/// `want` names for its kind (present, possibly null where the page says so).
#[track_caller]
fn event(line: &str) -> Value {
    let v: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("stderr line is not JSON ({e}): {line:?}"));
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {line}"));
    for f in COMMON {
        assert!(obj.contains_key(f), "no `{f}` in {line}");
    }
    let name = v["event"].as_str().expect("event is a string");
    for f in promised(name) {
        assert!(obj.contains_key(*f), "`{name}` event without `{f}`: {line}");
    }
    assert!(v["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{line}");
    v
}

/// The fields docs/json.md promises for each event besides the common ones.
fn promised(name: &str) -> &'static [&'static str] {
    match name {
        "waiting" => &["state", "verdict"],
        "acquired" => &["token", "lease_id", "ttl_ms", "heartbeat_ms", "grace_ms"],
        "broke" => &["state", "token", "pid", "host", "reason", "verdict"],
        "refused" => &["because", "exit"],
        "fenced" => &["command", "reason", "survivors", "exit"],
        "timed-out" => &["command", "limit_ms", "survivors", "exit"],
        "leftovers-stopped" => &["command", "stopped"],
        "serving" => &["pid", "user", "blocked"],
        "released" => &["how", "exit", "skipped"],
        "not-started" => &["exit"],
        other => panic!("an event this test does not expect: {other}"),
    }
}

/// Every line of `err` as an event (each must parse), and their names.
#[track_caller]
fn events(err: &str) -> (Vec<Value>, Vec<String>) {
    let evs: Vec<Value> = err.lines().map(event).collect();
    let names = evs
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_string())
        .collect();
    (evs, names)
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

#[test]
fn run_json_on_a_free_lock_reports_acquired_and_released_and_leaves_stdout_to_the_command() {
    let d = tmp();
    let lock = d.path().join("free.lock");
    let out = lh_run(&["--json"], &lock, &["-c", "echo out; exit 3"]).code(3);
    assert_eq!(String::from_utf8_lossy(&out.get_output().stdout), "out\n");
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(names, ["acquired", "released"], "{evs:?}");
    let l = lease(&lock).expect("lease");
    assert_eq!(evs[0]["token"], l["token"]);
    assert_eq!(evs[0]["lease_id"], l["lease_id"]);
    assert_eq!(evs[0]["lock"], lock.display().to_string());
    assert_eq!(evs[0]["ttl_ms"], 30_000);
    assert_eq!(evs[1]["exit"], 3);
    assert!(
        evs[1]["how"].as_str().unwrap().contains('3'),
        "{:?}",
        evs[1]
    );
    // -q hides nothing from --json (scripts read every event); the human lines stay as they
    // were: nothing at all on a free lock.
    let q = lh_run(&["--json", "-q"], &lock, &["--", "true"]).success();
    assert_eq!(events(&stderr_of(&q)).1, ["acquired", "released"]);
    lh_run(&[], &lock, &["--", "true"]).success().stderr("");
}

#[test]
fn run_json_no_wait_on_a_held_lock_reports_refused_with_the_holder_and_exits_75() {
    let d = tmp();
    let lock = d.path().join("held.lock");
    let mut h = Holder::start(&lock, &["--ttl", "5s", "--note", "nightly"]);
    let (wrapper, _, _) = wait_for_child(&lock);
    let out = lh_run(&["--json", "-n"], &lock, &["--", "true"]).code(75);
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(names, ["refused"], "{evs:?}");
    let e = &evs[0];
    assert_eq!(e["because"], "held");
    assert_eq!(e["exit"], 75);
    assert_eq!(e["verdict"]["state"], "held");
    assert_eq!(e["verdict"]["pid"], wrapper);
    assert_eq!(e["verdict"]["note"], "nightly");
    assert!(e["message"].as_str().unwrap().contains("held by"), "{e}");
    // -E's status is the event's exit too.
    let out = lh_run(&["--json", "-n", "-E", "3"], &lock, &["--", "true"]).code(3);
    assert_eq!(events(&stderr_of(&out)).0[0]["exit"], 3);
    assert_eq!(h.finish().code(), Some(0));
}

#[test]
fn run_json_waiting_then_acquiring_reports_waiting_once_then_acquired_and_released() {
    let d = tmp();
    let lock = d.path().join("wait.lock");
    let mut h = Holder::start(&lock, &["--ttl", "1s"]);
    let (holder, _, _) = wait_for_child(&lock);
    let mut w = Proc::spawn(
        lh().args(["run", "--json", "-w", "20s", "--ttl", "1s"])
            .arg(&lock)
            .args(["--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "waiter",
    );
    // Synchronised on the waiter's own first event: it waits behind the holder.
    let mut err = BufReader::new(w.take_stderr().expect("stderr"));
    let mut first = String::new();
    err.read_line(&mut first).expect("read waiter stderr");
    let waiting = event(&first);
    assert_eq!(waiting["event"], "waiting", "{first}");
    assert_eq!(waiting["state"], "held");
    assert_eq!(waiting["verdict"]["pid"], holder);
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .starts_with("Blocking waiting for lock "),
        "{first}"
    );
    assert_eq!(h.finish().code(), Some(0));
    let st = w.wait_timeout(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    let mut rest = String::new();
    for l in err.lines() {
        rest.push_str(&l.expect("stderr line"));
        rest.push('\n');
    }
    // The holder did not change while we waited: no second `waiting`.
    let (evs, names) = events(&rest);
    assert_eq!(names, ["acquired", "released"], "{evs:?}");
    assert!(evs[0]["token"].as_u64() > waiting["verdict"]["token"].as_u64());
}

#[test]
fn run_json_reports_a_fence_when_the_lease_is_revoked_and_exits_74() {
    let d = tmp();
    let lock = d.path().join("fence.lock");
    let mut w = Proc::spawn(
        lh().args(["run", "--json", "--ttl", "1s"])
            .arg(&lock)
            .args(["--", "sleep", "100"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "wrapper",
    );
    let (_, _, pgid) = wait_for_child(&lock);
    lh_assert()
        .args(["break", "--force"])
        .arg(&lock)
        .assert()
        .success();
    let st = w.wait_timeout(Duration::from_secs(10));
    let err = w.stderr();
    assert_eq!(st.code(), Some(74), "{err}");
    assert!(group(pgid).is_empty(), "the fenced job is gone");
    let (evs, names) = events(&err);
    assert_eq!(names.first().map(String::as_str), Some("acquired"), "{err}");
    let fenced: Vec<&Value> = evs.iter().filter(|e| e["event"] == "fenced").collect();
    assert_eq!(fenced.len(), 1, "{err}");
    let f = fenced[0];
    assert_eq!(f["exit"], 74);
    assert_eq!(f["command"], serde_json::json!(["sleep", "100"]));
    assert_eq!(f["survivors"], 0);
    assert!(
        f["reason"].as_str().unwrap().contains("revoked by"),
        "{err}"
    );
    // Nothing but the acquisition, the fence and how the release went.
    for n in &names {
        assert!(
            ["acquired", "fenced", "released", "error"].contains(&n.as_str()),
            "{err}"
        );
    }
}

#[test]
fn run_json_reports_the_stale_lease_it_broke_before_acquired() {
    let d = tmp();
    let lock = d.path().join("stale.lock");
    // A holder that is SIGKILLed leaves a stale lease (its command dies with it).
    let mut h = Holder::start(&lock, &["--ttl", "30s"]);
    let (wrapper, child, _) = wait_for_child(&lock);
    let old = lease(&lock).expect("lease")["token"].clone();
    kill_wrapper(&mut h.kid, child);
    let out = lh_run(&["--json"], &lock, &["--", "true"]).success();
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(names, ["broke", "acquired", "released"], "{evs:?}");
    let b = &evs[0];
    assert_eq!(b["state"], "stale");
    assert_eq!(b["pid"], wrapper);
    assert_eq!(b["token"], old);
    assert_eq!(b["verdict"]["state"], "stale");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .starts_with("leasehold: broke stale lease"),
        "{b}"
    );
}

#[test]
fn run_json_reports_a_command_that_cannot_start_with_exit_127() {
    let d = tmp();
    let lock = d.path().join("nostart.lock");
    let out = lh_run(&["--json"], &lock, &["--", "no-such-command-x"]).code(127);
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(names, ["not-started"], "{evs:?}");
    assert_eq!(evs[0]["exit"], 127);
    assert!(
        evs[0]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-command-x"),
        "{:?}",
        evs[0]
    );
}

#[test]
fn run_json_once_per_refusal_comes_after_acquired_and_ends_with_a_skipped_release() {
    let d = tmp();
    let lock = d.path().join("once.lock");
    let first = lh_run(&["--json", "--once-per", "1h"], &lock, &["--", "true"]).success();
    assert_eq!(events(&stderr_of(&first)).1, ["acquired", "released"]);
    let ran = d.path().join("ran");
    let out = lh_run(
        &["--json", "--once-per", "1h"],
        &lock,
        &["--", "touch", ran.to_str().expect("utf-8 path")],
    )
    .code(75);
    assert!(
        !ran.exists(),
        "the command ran within its --once-per period"
    );
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(names, ["acquired", "refused", "released"], "{evs:?}");
    assert_eq!(evs[1]["because"], "once-per");
    assert_eq!(evs[1]["exit"], 75);
    assert_eq!(evs[1]["period_ms"], 3_600_000);
    assert_eq!(evs[2]["skipped"], true);
    assert_eq!(evs[2]["exit"], 75);
    // The human lines stay as they were: the refusal alone, even with -v's release lines.
    let out = lh_run(&["-v", "--once-per", "1h"], &lock, &["--", "true"]).code(75);
    let err = stderr_of(&out);
    assert!(!err.contains("leasehold: released"), "{err}");
    assert!(err.contains("not running the command"), "{err}");
}

#[test]
fn run_json_reports_max_time_and_leftovers_with_the_runs_exit_status() {
    let d = tmp();
    let lock = d.path().join("ends.lock");
    let out = lh_run(
        &["--json", "--max-time", "300ms"],
        &lock,
        &["--", "sleep", "30"],
    )
    .code(124);
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(names, ["acquired", "timed-out", "released"], "{evs:?}");
    assert_eq!(evs[1]["limit_ms"], 300);
    assert_eq!(evs[1]["exit"], 124);
    assert_eq!(evs[1]["command"], serde_json::json!(["sleep", "30"]));
    assert_eq!(evs[2]["exit"], 124);
    let out = lh_run(&["--json"], &lock, &["-c", "sleep 30 & exit 0"]).success();
    let (evs, names) = events(&stderr_of(&out));
    assert_eq!(
        names,
        ["acquired", "leftovers-stopped", "released"],
        "{evs:?}"
    );
    assert_eq!(evs[1]["stopped"], 1);
    assert_eq!(evs[2]["exit"], 0);
}
