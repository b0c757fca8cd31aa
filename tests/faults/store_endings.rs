//! The lock remembers how the last holding ended on a networked store too (issue 30; PROTOCOL.md
//! §14 *Endings* for etcd, §15 *Endings* for S3): the same scenarios against a real etcd
//! cluster (`etcd::endings::`) and a real Ceph RADOS Gateway (`s3::endings::`) —
//! `LEASEHOLD_PREVIOUS*` after a clean exit with status 3, a SIGKILL of wrapper and command, a
//! fence and a break; `--after-crash fail` until `leasehold ack`; `--recover` only after an
//! unclean ending; `--once-per` across two processes; `--max-time` (124, the deadline in
//! `status`).

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Proc, code, ensure_within};

/// A store to run the scenarios on: `leasehold` with the store's environment, a fresh lock URL
/// for a name, and a scratch directory.
pub struct On<'a> {
    pub cmd: &'a dyn Fn() -> Command,
    pub url: &'a dyn Fn(&str) -> String,
    pub dir: PathBuf,
}

impl On<'_> {
    /// `leasehold ARGS`: exit status, stdout, stderr.
    fn lh(&self, args: &[&str]) -> (i32, String, String) {
        let o = (self.cmd)().args(args).output().expect("run leasehold");
        (
            code(o.status),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// `leasehold run FLAGS URL -c SCRIPT` to its end.
    fn run(&self, url: &str, flags: &[&str], script: &str) -> (i32, String, String) {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[url, "-c", script]);
        self.lh(&args)
    }

    /// The PREVIOUS values a plain run of `url` sees now (waiting up to a minute).
    #[track_caller]
    fn previous(&self, url: &str) -> Vec<String> {
        let (rc, out, err) = self.run(url, &["-w", "60s"], SHOW);
        assert_eq!(rc, 0, "{err}");
        out.split_whitespace().map(String::from).collect()
    }

    /// `status --json`.
    #[track_caller]
    fn status(&self, url: &str) -> serde_json::Value {
        let (rc, out, err) = self.lh(&["status", "--json", url]);
        assert_eq!(rc, 0, "{err}");
        serde_json::from_str(&out).expect("status JSON")
    }

    /// A run fenced by `--max-time 300ms`: an unclean ending, quickly.
    #[track_caller]
    fn fenced_run(&self, url: &str) {
        let (rc, _, err) = self.run(url, &["--max-time", "300ms"], "sleep 100");
        assert_eq!(rc, 124, "{err}");
    }

    /// A `leasehold run` of `url` whose command runs until killed; once it runs: the wrapper,
    /// the command's pid and the holding's token (from `status --json`).
    fn victim(&self, url: &str, flags: &[&str], name: &str) -> (Proc, i32, u64) {
        let ran = self.dir.join(format!("victim-{name}"));
        let mut c = (self.cmd)();
        c.arg("run")
            .args(flags)
            .args([url, "-c", &format!("touch '{}'; sleep 100", ran.display())])
            .stderr(Stdio::piped());
        let w = Proc::spawn(c, "victim");
        let mut found = (0, 0);
        // Its command's start is what tells it runs (an etcd key's record names the command
        // from the join, before its holder is first).
        ensure_within(
            "the victim's command to run",
            Duration::from_secs(20),
            || {
                if !ran.exists() {
                    return false;
                }
                let v = self.status(url);
                match (
                    v["pid"].as_i64(),
                    v["child_pid"].as_i64(),
                    v["token"].as_u64(),
                ) {
                    (Some(p), Some(c), Some(t)) if p == i64::from(w.pid()) => {
                        found = (c as i32, t);
                        true
                    }
                    _ => false,
                }
            },
        );
        (w, found.0, found.1)
    }
}

/// What the next command sees: `PREVIOUS STATUS TOKEN HOST ENDED` (`-` when empty).
const SHOW: &str = r#"for v in "$LEASEHOLD_PREVIOUS" "$LEASEHOLD_PREVIOUS_STATUS" "$LEASEHOLD_PREVIOUS_TOKEN" "$LEASEHOLD_PREVIOUS_HOST" "$LEASEHOLD_PREVIOUS_ENDED"; do printf '%s ' "${v:--}"; done"#;

/// SIGKILLs wrapper `w` and its command `child`, and reaps the wrapper.
fn kill_both(w: &mut Proc, child: i32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    w.signal(Signal::SIGKILL);
    let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    w.wait_timeout(Duration::from_secs(10));
}

/// PREVIOUS after exit 3 (`released 3`), a SIGKILL of wrapper and command (`died`; `ttl` is the
/// victim's `--ttl`, which a store that cannot see the holder's death waits out), a fence
/// (`fenced`), a live holder broken by force and a dead one broken (`broken`).
pub fn previous_is_released_3_died_fenced_and_broken(on: &On<'_>, ttl: &str) {
    let host = leasehold::Identity::current().host;

    let url = (on.url)("end-released");
    assert_eq!(on.previous(&url)[0], "none");
    let (rc, _, err) = on.run(&url, &[], "exit 3");
    assert_eq!(rc, 3, "{err}");
    let e = on.status(&url)["last_ending"].clone();
    assert_eq!(
        (e["how"].as_str(), e["exit_status"].as_i64()),
        (Some("released"), Some(3)),
        "{e}"
    );
    let token = e["token"].as_u64().expect("token");
    let p = on.previous(&url);
    assert_eq!(p[..2], ["released", "3"], "{p:?}");
    assert_eq!(p[2], token.to_string(), "{p:?}");
    assert_eq!(p[3], host, "{p:?}");
    assert!(leasehold::parse_rfc3339(&p[4]).is_some(), "{p:?}");
    assert_eq!(on.previous(&url)[..2], ["released", "0"]);

    let url = (on.url)("end-died");
    let (mut w, child, token) = on.victim(&url, &["--ttl", ttl, "--heartbeat", "500ms"], "died");
    kill_both(&mut w, child);
    let p = on.previous(&url);
    assert_eq!(p[..3], ["died", "-", &token.to_string()], "{p:?}");

    let url = (on.url)("end-fenced");
    on.fenced_run(&url);
    let e = on.status(&url)["last_ending"].clone();
    assert_eq!(e["how"], "fenced", "{e}");
    assert_eq!(on.previous(&url)[..2], ["fenced", "-"]);

    // A live holder broken by force: it fences (74), its release names the breaker.
    let url = (on.url)("end-broken-live");
    let (mut w, _, _) = on.victim(&url, &["--ttl", "30s", "--heartbeat", "300ms"], "live");
    let (rc, _, err) = on.lh(&["break", "--force", &url]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(code(w.wait_timeout(Duration::from_secs(10))), 74);
    let e = on.status(&url)["last_ending"].clone();
    assert_eq!(e["how"], "broken", "{e}");
    assert!(e["by"].as_str().is_some_and(|b| b.contains('@')), "{e}");
    assert_eq!(on.previous(&url)[0], "broken");

    // A dead holder broken (stale on this host): `broken`, at once, well before its TTL.
    let url = (on.url)("end-broken-stale");
    let (mut w, child, _) = on.victim(&url, &["--ttl", "30s"], "stale");
    kill_both(&mut w, child);
    let t0 = Instant::now();
    let (rc, _, err) = on.lh(&["break", &url]);
    assert_eq!(rc, 0, "{err}");
    let e = on.status(&url)["last_ending"].clone();
    assert_eq!(e["how"], "broken", "{e}");
    assert_eq!(on.previous(&url)[0], "broken");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

/// `--after-crash fail` refuses (79) until `ack`, which a held lock refuses; `--recover` runs
/// only after an unclean ending, first, under the same lease.
pub fn after_crash_fail_until_ack_and_recover(on: &On<'_>) {
    let url = (on.url)("end-ack");
    let ran = on.dir.join("ran");
    let touch = format!("touch '{}'", ran.display());
    let (rc, _, err) = on.run(&url, &["--after-crash", "fail"], "true");
    assert_eq!(rc, 0, "clean endings never refuse: {err}");
    on.fenced_run(&url);
    for _ in 0..2 {
        let (rc, _, err) = on.run(&url, &["--after-crash", "fail"], &touch);
        assert_eq!(rc, 79, "{err}");
        assert!(
            err.contains("fenced") && err.contains("leasehold ack"),
            "{err}"
        );
        assert!(!ran.exists(), "the command ran after an unclean ending");
    }
    assert_eq!(on.status(&url)["last_ending"]["needs_ack"], true);
    let (mut w, child, _) = on.victim(&url, &["--ttl", "30s"], "ack");
    let (rc, _, err) = on.lh(&["ack", &url]);
    assert_eq!(rc, 75, "{err}");
    assert!(err.contains("held"), "{err}");
    kill_both(&mut w, child);
    let (rc, _, err) = on.lh(&["break", &url]);
    assert_eq!(rc, 0, "{err}");
    let (rc, _, err) = on.lh(&["ack", &url]);
    assert_eq!(rc, 0, "{err}");
    let e = on.status(&url)["last_ending"].clone();
    assert_eq!(e["how"], "broken", "{e}");
    assert!(
        e["acked"]["by"].as_str().is_some_and(|b| b.contains('@')),
        "{e}"
    );
    let (rc, _, err) = on.run(&url, &["--after-crash", "fail"], &touch);
    assert_eq!(rc, 0, "{err}");
    assert!(ran.exists());
    let (rc, _, _) = on.lh(&["ack", &url]);
    assert_eq!(rc, 75, "nothing to acknowledge after a clean ending");

    let url = (on.url)("end-recover");
    let log = on.dir.join("log");
    let rec = format!(
        "echo \"recover $LEASEHOLD_PREVIOUS $LEASEHOLD_TOKEN\" >> '{}'",
        log.display()
    );
    let cmd = format!("echo \"command $LEASEHOLD_TOKEN\" >> '{}'", log.display());
    let lines = || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    for _ in 0..2 {
        let (rc, _, err) = on.run(&url, &["--recover", &rec], &cmd);
        assert_eq!(rc, 0, "{err}");
    }
    assert!(
        lines().iter().all(|l| l.starts_with("command")),
        "{:?}",
        lines()
    );
    fs::remove_file(&log).unwrap();
    on.fenced_run(&url);
    let (rc, _, err) = on.run(&url, &["--recover", &rec], &cmd);
    assert_eq!(rc, 0, "{err}");
    let l = lines();
    assert_eq!(l.len(), 2, "{l:?}");
    let token = l[1].strip_prefix("command ").expect("the command second");
    assert_eq!(l[0], format!("recover fenced {token}"));
    fs::remove_file(&log).unwrap();
    on.fenced_run(&url);
    let (rc, _, err) = on.run(&url, &["--recover", "exit 5"], &cmd);
    assert_eq!(rc, 5, "{err}");
    assert!(lines().is_empty(), "{:?}", lines());
    assert_eq!(on.status(&url)["last_ending"]["how"], "fenced");
}

/// `--once-per` across two processes (one runs, the other 75; `-E 0`), and `--max-time` (124
/// within the grace, the deadline in `status` while it runs).
pub fn once_per_across_two_processes_and_max_time_124(on: &On<'_>) {
    let url = (on.url)("end-once");
    let marks = on.dir.join("marks");
    fs::create_dir(&marks).unwrap();
    let procs: Vec<Proc> = (0..2)
        .map(|i| {
            let mut c = (on.cmd)();
            c.args(["run", "--once-per", "1h", "-w", "60s", &url, "-c"])
                .arg(format!("touch '{}/{i}'; sleep 0.3", marks.display()));
            Proc::spawn_collecting(c, "once-per run")
        })
        .collect();
    let mut codes: Vec<(i32, String)> = procs
        .into_iter()
        .map(|mut p| {
            let o = p.finish(Duration::from_secs(60));
            (o.code, o.stderr)
        })
        .collect();
    codes.sort();
    assert_eq!((codes[0].0, codes[1].0), (0, 75), "{codes:?}");
    assert_eq!(fs::read_dir(&marks).unwrap().count(), 1);
    let (rc, _, err) = on.run(&url, &["--once-per", "1h"], "touch never");
    assert_eq!(rc, 75, "{err}");
    assert!(err.contains("next start is allowed at"), "{err}");
    let x = format!("touch '{}/x'", marks.display());
    let (rc, _, err) = on.run(&url, &["--once-per", "1h", "-E", "0"], &x);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(fs::read_dir(&marks).unwrap().count(), 1);
    assert_eq!(on.status(&url)["last_ending"]["how"], "released");
    let (rc, _, err) = on.run(&url, &["--once-per", "1ms"], "true");
    assert_eq!(rc, 0, "{err}");

    let url = (on.url)("end-max");
    let started = Instant::now();
    let mut c = (on.cmd)();
    c.args([
        "run",
        "--max-time",
        "2s",
        "--grace",
        "500ms",
        &url,
        "-c",
        "sleep 100",
    ])
    .stderr(Stdio::piped());
    let mut w = Proc::spawn(c, "max-time run");
    let mut v = serde_json::Value::Null;
    ensure_within(
        "the holding to show its deadline",
        Duration::from_secs(20),
        || {
            v = on.status(&url);
            v["child_pid"].as_i64().is_some() && v["deadline"].is_string()
        },
    );
    let d = leasehold::parse_rfc3339(v["deadline"].as_str().expect("deadline")).unwrap();
    let a = leasehold::parse_rfc3339(v["acquired_at"].as_str().expect("acquired_at")).unwrap();
    assert_eq!(
        d.duration_since(a).ok(),
        Some(Duration::from_secs(2)),
        "{v}"
    );
    let st = w.wait_timeout(Duration::from_secs(20));
    let took = started.elapsed();
    assert_eq!(code(st), 124, "{}", w.stderr());
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(8),
        "{took:?}"
    );
    let child = v["child_pid"].as_i64().unwrap() as i32;
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None).is_err(),
        "the command is gone"
    );
    assert_eq!(on.status(&url)["last_ending"]["how"], "fenced");
}
