//! `leasehold run` basics through the real binary: exit statuses (the command's own, 128+N for a
//! death signal, 64 usage, 65/66 bad LOCK, 127 not found), DURATION parsing, timing refusals
//! naming the flag, the command's environment, --help listing every exit status, -q and -v.

use std::time::Duration;

use crate::support::*;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[test]
fn help_lists_every_exit_status() {
    for args in [vec!["--help"], vec!["run", "--help"]] {
        let out = lh_assert().args(&args).assert().success();
        let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        for code in [
            "128+N", "75", "74", "64", "65", "66", "69", "70", "73", "77",
        ] {
            assert!(
                text.contains(code),
                "{args:?} help lacks exit status {code}:\n{text}"
            );
        }
    }
    let out = lh_assert().args(["run", "--help"]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for flag in [
        "--no-wait",
        "--wait",
        "--ttl",
        "--heartbeat",
        "--grace",
        "--conflict-exit-code",
        "--note",
        "--quiet",
        "--verbose",
        "--poll",
    ] {
        assert!(text.contains(flag), "run --help lacks {flag}");
    }
}

#[test]
fn command_exit_status_is_passed_through() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    for code in [0, 1, 3, 42, 255] {
        lh_run(&[], &lock, &["--", "sh", "-c", &format!("exit {code}")]).code(code);
    }
    // -c runs a shell command.
    lh_run(&[], &lock, &["-c", "exit 9"]).code(9);
}

#[test]
fn death_signal_becomes_128_plus_n_and_is_recorded() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    for (sig, code) in [("KILL", 137), ("TERM", 143), ("SEGV", 139)] {
        lh_run(&[], &lock, &["-c", &format!("kill -{sig} $$")]).code(code);
    }
    // The released lease says how the job ended.
    let l = lease(&lock).expect("lease");
    assert_eq!(l["state"], "released");
    let how = l["ended"]["how"].as_str().unwrap_or_default();
    assert!(how.contains("signal 11"), "ended.how = {how}");
}

#[test]
fn environment_names_lock_token_and_lease_id() {
    let d = tmp();
    let lock = d.path().join("env.lock");
    // A relative LOCK with a symlinked directory part: the path is made absolute with its
    // directory canonicalised.
    let real = d.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
    let out = lh_assert()
        .current_dir(d.path())
        .args(["run", "link/env.lock", "--"])
        .args([
            "sh",
            "-c",
            "echo \"$LEASEHOLD_LOCK\"; echo \"$LEASEHOLD_TOKEN\"; echo \"$LEASEHOLD_LEASE_ID\"",
        ])
        .env("LEASEHOLD_TOKEN", "stale-value-from-outside")
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let canon = std::fs::canonicalize(&real).unwrap().join("env.lock");
    assert_eq!(lines[0], canon.to_str().unwrap());
    let token: u64 = lines[1].parse().expect("decimal token");
    assert!(token >= 1);
    assert_eq!(lines[2].len(), 32);
    assert!(lines[2].chars().all(|c| c.is_ascii_hexdigit()));
    let l = lease(&canon).expect("lease");
    assert_eq!(l["token"], token);
    assert_eq!(l["lease_id"], lines[2]);
    let _ = lock;

    // The next holder gets a greater token.
    let out = lh_assert()
        .current_dir(d.path())
        .args(["run", "link/env.lock", "-c", "echo $LEASEHOLD_TOKEN"])
        .assert()
        .success();
    let next: u64 = String::from_utf8_lossy(&out.get_output().stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(next > token);
}

#[test]
fn durations_parse_and_bad_ones_are_usage_errors_naming_the_flag() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    for ok in [
        vec!["--ttl", "300ms"],
        vec!["--ttl", "1.5"],
        vec!["--ttl", "1h30m", "-w", "2.5"],
        vec!["--ttl", "2s", "--heartbeat", "500ms", "--grace", "0.5"],
    ] {
        lh_run(&ok, &lock, &["--", "true"]).success();
    }
    for (args, flag) in [
        (vec!["--ttl", "5x"], "--ttl"),
        (vec!["-w", "soon"], "--wait"),
        (vec!["--heartbeat", "-1"], "--heartbeat"),
        (vec!["--grace", ""], "--grace"),
        (vec!["--ttl", "1s", "--heartbeat", "900ms"], "--heartbeat"),
        (vec!["--ttl", "1s", "--grace", "900ms"], "--grace"),
        (vec!["--ttl", "0"], "--ttl"),
        (vec!["-E", "300"], "--conflict-exit-code"),
    ] {
        lh_run(&args, &lock, &["--", "true"])
            .code(64)
            .stderr_has(flag);
    }
}

#[test]
fn usage_errors_exit_64() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    lh_assert().args(["run"]).assert().code(64);
    lh_assert().arg("run").arg(&lock).assert().code(64);
    lh_run(&[], &lock, &["-c", "true", "--", "true"]).code(64);
    lh_run(&["-n", "-w", "1s"], &lock, &["--", "true"]).code(64);
    lh_assert().args(["frobnicate"]).assert().code(64);
    lh_assert().args(["status"]).assert().code(64);
    lh_assert()
        .args(["break", "--force", "--lease-id", "abc"])
        .arg(&lock)
        .assert()
        .code(64);
}

#[test]
fn lock_that_is_not_a_lease_or_cannot_be_opened() {
    let d = tmp();
    let dir_lock = d.path().join("dir.lock");
    std::fs::create_dir(&dir_lock).unwrap();
    lh_run(&[], &dir_lock, &["--", "true"]).code(65);
    let junk = d.path().join("junk.lock");
    std::fs::write(&junk, "this is somebody else's file\n").unwrap();
    lh_run(&[], &junk, &["--", "true"])
        .code(65)
        .stderr_has("not a leasehold lease");
    assert_eq!(
        std::fs::read_to_string(&junk).unwrap(),
        "this is somebody else's file\n",
        "left untouched"
    );
    let link = d.path().join("link.lock");
    std::os::unix::fs::symlink(&junk, &link).unwrap();
    lh_run(&[], &link, &["--", "true"]).code(65);
    let missing = d.path().join("no/such/dir/x.lock");
    lh_run(&[], &missing, &["--", "true"]).code(66);
    // The command itself cannot be found: 127, and nothing was run.
    lh_run(
        &[],
        &d.path().join("ok.lock"),
        &["--", "leasehold-no-such-command"],
    )
    .code(127)
    .stderr_has("command not found");
    // status of a non-lease fails, with its exit status.
    lh_assert().arg("status").arg(&junk).assert().code(65);
}

#[test]
fn quiet_prints_nothing_and_verbose_names_token_and_lease_id() {
    let d = tmp();
    let lock = d.path().join("x.lock");
    lh_assert()
        .args(["run", "-q"])
        .arg(&lock)
        .args(["--", "true"])
        .assert()
        .success()
        .stderr("")
        .stdout("");
    let out = lh_assert()
        .args(["run", "-v"])
        .arg(&lock)
        .args(["-c", "echo $LEASEHOLD_LEASE_ID"])
        .assert()
        .success();
    let o = out.get_output();
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("token 2"), "{err}");
    assert!(err.contains(&id), "{err}");
    assert!(err.contains("released"), "{err}");
}

/// `leasehold run L -- cmd | head -1` (a pitfall of pipelines): the command dies of SIGPIPE when
/// `head` exits, and leasehold, whose stdout is the command's, releases cleanly: exit 141
/// (128 + SIGPIPE), the record says how the command ended, nothing is left beside LOCK, and
/// the next run takes the lock at once. With `-v` leasehold's own lines go to stderr, so the
/// closed pipe does not make it fail either.
#[test]
fn a_command_killed_by_sigpipe_in_a_pipeline_releases_cleanly() {
    let d = tmp();
    let lock = d.path().join("pipe.lock");
    for flags in ["", "-v"] {
        let line = format!(
            "'{}' run {flags} '{}' -- yes | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
            bin().display(),
            lock.display()
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &line])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("bash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stdout, "y\nstatus 141\n", "{flags:?}: stderr: {stderr}");
        assert!(!stderr.contains("leasehold: error"), "{flags:?}: {stderr}");
        let l = lease(&lock).expect("the lease");
        assert_eq!(l["state"], "released", "{flags:?}: {l}");
        assert!(
            l["ended"]["how"]
                .as_str()
                .unwrap_or_default()
                .contains("SIGPIPE"),
            "{flags:?}: {l}"
        );
        let stray = stray_files(d.path(), "pipe.lock");
        assert!(stray.is_empty(), "{flags:?}: left beside LOCK: {stray:?}");
        lh_assert()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "true"])
            .assert()
            .code(0);
    }
}

/// Voluntary context switches of the thread of `pid` named `name` (`/proc/PID/task/*/comm`).
fn thread_switches(pid: u32, name: &str) -> Option<u64> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let s = std::fs::read_to_string(t.path().join("status")).ok()?;
            return s
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok());
        }
    }
    None
}

/// An idle holder wakes once per heartbeat: its renewer sleeps until the next renewal and reads
/// back the close of its own write (the watch on LOCK's directory reports it) instead of being
/// woken by it, and the watchdog sleeps until a deadline. Before, each renewal woke the
/// watchdog (the watch's event) and then the renewer twice more (for a look at a record that
/// was its own write): 3.7 wake-ups per heartbeat in the idle bench.
#[test]
fn an_idle_holder_wakes_once_per_heartbeat_not_for_its_own_renewals() {
    let d = tmp();
    let lock = d.path().join("idle.lock");
    let mut holder = lh()
        .args(["run", "--ttl", "3s"])
        .arg(&lock)
        .args(["--", "sleep", "30"])
        .spawn()
        .expect("spawn the holder");
    let pid = holder.id();
    let seq = || lease(&lock).and_then(|v| v["heartbeat_seq"].as_u64());
    // Past its first renewal (the watch is added at the first look, a little after the take).
    ensure_within("the first renewal", Duration::from_secs(10), || {
        seq().is_some_and(|s| s >= 1)
    });
    let wait_past = |s: u64| {
        ensure_within("a renewal", Duration::from_secs(10), || {
            seq().is_some_and(|n| n > s)
        });
        seq().unwrap_or(s)
    };
    let start = wait_past(seq().unwrap_or(0));
    let (renew0, watch0) = (
        thread_switches(pid, "leasehold-renew").expect("renewer thread"),
        thread_switches(pid, "leasehold-watch").expect("watchdog thread"),
    );
    let mut end = start;
    for _ in 0..3 {
        end = wait_past(end);
    }
    let renew = thread_switches(pid, "leasehold-renew").expect("renewer thread") - renew0;
    let watch = thread_switches(pid, "leasehold-watch").expect("watchdog thread") - watch0;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = holder.wait();
    let renewals = end - start;
    assert_eq!(
        watch, 0,
        "the watchdog woke {watch} times over {renewals} renewals, no deadline reached"
    );
    assert!(
        renew <= renewals + 2,
        "the renewer woke {renew} times for {renewals} renewals"
    );
}
