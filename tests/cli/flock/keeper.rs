//! The FD form and `-F` under a lease kept by a detached keeper (script mode's): real shells
//! running flock(1)'s idiom `exec 9>F; flock -n 9 || exit 1; ...`. The lease is held for the
//! shell, released when the shell exits, when `flock -u 9` runs, and kept while a daemon that
//! inherited the descriptor holds the kernel lock; a second converted lock is refused; `-F`
//! leases for the exec'd command; a SIGKILLed keeper leaves a shell judged as a frozen holder.

use std::os::unix::process::ExitStatusExt;

use nix::sys::signal::Signal;

use super::*;

/// `sh -c BODY` in a session of its own (no controlling terminal, as under cron), with `$F`
/// the lock file, `$FLOCK` the flock under test, `$LH` leasehold, `$D` the bench directory.
fn shell(b: &Bench, f: &Path, body: &str) -> Command {
    let mut c = plain_shell(b, f, body);
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    c
}

/// [`shell`] in the caller's session (for [`outcome`], which gives it a process group).
fn plain_shell(b: &Bench, f: &Path, body: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", body])
        .env("F", f)
        .env("FLOCK", b.ours_path())
        .env("LH", bin())
        .env("D", b.dir.path())
        .env_remove("LEASEHOLD_LOCK")
        .env_remove("LEASEHOLD_LEASE_ID")
        .env_remove("LEASEHOLD_FLOCK_TTL")
        .stderr(Stdio::piped());
    c
}

/// `status --json` of the lease of `f`, once it parses.
#[track_caller]
fn status_of(b: &Bench, name: &str) -> serde_json::Value {
    lease_json(&lease_of(&b.path(name))).expect("a lease for the file")
}

#[test]
fn descriptor_form_leases_for_the_shell_and_releases_when_it_exits() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("fd.lock");
    let fs_ = f.to_str().unwrap();
    let body = r#"exec 9>"$F"; "$FLOCK" -n 9 || exit 1; echo "held $$"; read x || :; echo bye"#;
    let mut p = Proc::spawn_piped(shell(&b, &f, body), "shell");
    let pid: i32 = p.line("held", LIMIT).parse().unwrap();
    // `leasehold status FILE` finds the lease beside the file.
    let out = lh().arg("status").arg("--json").arg(&f).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "held", "{v}");
    assert_eq!(v["script_pid"], pid, "the shell is the lease's holder: {v}");
    assert_eq!(v["note"], "flock descriptor 9");
    let keeper = v["keeper_pid"].as_i64().unwrap() as i32;
    assert_ne!(keeper, pid);
    for fd in fs::read_dir(format!("/proc/{keeper}/fd")).unwrap() {
        let target = fs::read_link(fd.unwrap().path()).unwrap_or_default();
        assert_ne!(
            target, f,
            "the keeper holds a duplicate of the user's descriptor"
        );
    }
    // The kernel lock is held by the shell's descriptor; converted users are refused by the
    // lease, from another shell's descriptor as from the file form.
    assert_eq!(outcome(real(&["-n", fs_, "true"])).0, 1);
    let second = r#"exec 8>"$F"; "$FLOCK" -n 8; echo "second=$?""#;
    let (_, out, err) = outcome({
        let mut c = Command::new("sh");
        c.args(["-c", second])
            .env("F", &f)
            .env("FLOCK", b.ours_path());
        c
    });
    assert_eq!((out.as_str(), err.as_str()), ("second=1\n", ""));
    assert_eq!(outcome(b.ours(&["-n", fs_, "true"])).0, 1);
    p.close_stdin();
    assert_eq!(code(p.wait_timeout(LIMIT)), 0);
    ensure_within("the keeper's release", LIMIT, || {
        status_of(&b, "fd.lock")["lease_state"] == "released"
    });
    let how = status_of(&b, "fd.lock")["ended"]["how"].clone();
    assert!(
        how.as_str().unwrap().starts_with("kernel lock released"),
        "{how}"
    );
    assert_eq!(outcome(b.ours(&["-n", fs_, "true"])).0, 0);
}

#[test]
fn unlocking_the_descriptor_releases_the_lease_before_flock_u_returns() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("u.lock");
    let body = r#"exec 9>"$F"; "$FLOCK" -n 9 || exit 1
"$LH" status --json "$F" > "$D/before.json"
"$FLOCK" -u 9; echo "unlocked $?"
"$LH" status --json "$F" > "$D/after.json"
echo "looked $$"; read x || :"#;
    let mut p = Proc::spawn_piped(shell(&b, &f, body), "shell");
    assert_eq!(p.line("unlocked", LIMIT), "0");
    let pid: i32 = p.line("looked", LIMIT).parse().unwrap();
    let read = |n: &str| -> serde_json::Value {
        serde_json::from_slice(&fs::read(b.path(n)).unwrap()).unwrap()
    };
    let (before, after) = (read("before.json"), read("after.json"));
    assert_eq!(before["state"], "held", "{before}");
    assert_eq!(before["script_pid"], pid);
    assert_eq!(after["lease_state"], "released", "{after}");
    // The shell lives on without the lock: anyone may take it.
    assert_eq!(outcome(real(&["-n", f.to_str().unwrap(), "true"])).0, 0);
    assert_eq!(outcome(b.ours(&["-n", f.to_str().unwrap(), "true"])).0, 0);
    p.close_stdin();
    assert_eq!(code(p.wait_timeout(LIMIT)), 0);
}

#[test]
fn a_daemon_that_inherited_the_descriptor_keeps_the_lock_and_the_lease() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("d.lock");
    let fs_ = f.to_str().unwrap();
    let hold = b.path("hold");
    fs::write(&hold, "").unwrap();
    // The daemon waits for `hold` to go (a background job's stdin is /dev/null).
    let body = r#"exec 9>"$F"; "$FLOCK" -n 9 || exit 1
sh -c 'echo "daemon $$"; while [ -e "$D/hold" ]; do sleep 0.02; done' &
echo "shell $$""#;
    let mut p = Proc::spawn_piped(shell(&b, &f, body), "shell");
    let daemon: i32 = p.line("daemon", LIMIT).parse().unwrap();
    assert_eq!(code(p.wait_timeout(LIMIT)), 0, "the shell exited");
    // The keeper binds the lease to the daemon, which holds the kernel lock.
    ensure_within("the lease to name the daemon", LIMIT, || {
        status_of(&b, "d.lock")["script_pid"] == daemon
    });
    assert_eq!(status_of(&b, "d.lock")["state"], "held");
    assert_eq!(outcome(real(&["-n", fs_, "true"])).0, 1);
    assert_eq!(
        outcome(b.ours(&["-n", fs_, "true"])).0,
        1,
        "a converted user is refused while the daemon lives"
    );
    fs::remove_file(&hold).unwrap();
    ensure_within("the keeper's release", LIMIT, || {
        status_of(&b, "d.lock")["lease_state"] == "released"
    });
    assert_eq!(outcome(b.ours(&["-n", fs_, "true"])).0, 0);
}

#[test]
fn no_fork_leases_for_the_execd_command_and_releases_when_it_exits() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("F.lock");
    let fs_ = f.to_str().unwrap();
    let mut c = b.ours(&[
        "-F",
        fs_,
        "sh",
        "-c",
        r#"echo "held $$ $LEASEHOLD_LEASE_ID"; read x || :"#,
    ]);
    c.stderr(Stdio::piped()).env_remove("LEASEHOLD_LEASE_ID");
    let mut p = Proc::spawn_piped(c, "flock -F");
    let line = p.line("held", LIMIT);
    let (pid, id) = line.split_once(' ').unwrap();
    assert_eq!(
        pid.parse::<i32>().unwrap(),
        p.pid(),
        "-F execs in flock's process"
    );
    let v = status_of(&b, "F.lock");
    assert_eq!(v["state"], "held", "{v}");
    assert_eq!(
        v["script_pid"],
        p.pid(),
        "the command is the lease's holder"
    );
    assert_eq!(
        v["lease_id"], id,
        "the command carries its lease in its environment"
    );
    assert_eq!(outcome(real(&["-n", fs_, "true"])).0, 1);
    assert_eq!(outcome(b.ours(&["-n", fs_, "true"])).0, 1);
    p.close_stdin();
    assert_eq!(code(p.wait_timeout(LIMIT)), 0);
    ensure_within("the keeper's release", LIMIT, || {
        status_of(&b, "F.lock")["lease_state"] == "released"
    });
    assert_eq!(outcome(real(&["-n", fs_, "true"])).0, 0);
}

#[test]
fn a_sigkilled_keeper_leaves_the_shell_judged_frozen_and_stopped_by_a_contender() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("k.lock");
    let body = r#"exec 9>"$F"; "$FLOCK" -n 9 || exit 1; echo "held $$"; read x || :"#;
    let mut c = shell(&b, &f, body);
    c.env("LEASEHOLD_FLOCK_TTL", "1s");
    let mut p = Proc::spawn_piped(c, "shell");
    let pid: i32 = p.line("held", LIMIT).parse().unwrap();
    let v = status_of(&b, "k.lock");
    assert_eq!(v["script_pid"], pid);
    let keeper = v["keeper_pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(keeper), Signal::SIGKILL).unwrap();
    // A converted contender waits, judges the silent lease hung after its TTL, stops the shell
    // (which releases the kernel lock with its descriptor), and runs.
    let (c, out, err) = outcome({
        let mut c = b.ours(&["-w", "15", f.to_str().unwrap(), "echo", "ran"]);
        c.env("LEASEHOLD_FLOCK_TTL", "1s");
        c
    });
    assert_eq!((c, out.as_str()), (0, "ran\n"), "{err}");
    let st = p.wait_timeout(LIMIT);
    assert_eq!(st.signal(), Some(9), "the shell was SIGKILLed: {st:?}");
}

#[test]
fn a_lost_lease_stops_the_shell_that_leads_its_group() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("l.lock");
    let body = r#"exec 9>"$F"; "$FLOCK" -n 9 || exit 1
trap 'echo term; exit 3' TERM
echo "held $$"; while :; do sleep 0.05; done"#;
    let mut c = shell(&b, &f, body);
    c.env("LEASEHOLD_FLOCK_TTL", "2s");
    let mut p = Proc::spawn_piped(c, "shell");
    p.line("held", LIMIT);
    let o = lh().args(["break", "--force"]).arg(&f).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    p.line("term", LIMIT);
    assert_eq!(code(p.wait_timeout(LIMIT)), 3, "the shell's TERM trap ran");
}

#[test]
fn a_closed_descriptor_frees_the_lease_for_the_next_n_at_once() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("c.lock");
    // The same shell closes its locked descriptor and locks again at once, by file and by
    // another descriptor: neither is refused by the lease its keeper has not given back yet.
    let body = r#"exec 9>"$F"; "$FLOCK" -n 9 || exit 1; exec 9>&-
"$FLOCK" -n "$F" true; echo "file=$?"
exec 8>"$F"; "$FLOCK" -n 8; echo "fd=$?"
"$LH" status --json "$F" > "$D/s.json""#;
    let (c, out, err) = outcome(plain_shell(&b, &f, body));
    assert_eq!((c, out.as_str(), err.as_str()), (0, "file=0\nfd=0\n", ""));
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(b.path("s.json")).unwrap()).unwrap();
    assert_eq!(v["state"], "held", "descriptor 8 got its own lease: {v}");
    assert_eq!(v["note"], "flock descriptor 8");
}

#[test]
fn a_shell_that_execs_flock_gets_the_kernel_lock_only() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("e.lock");
    let t0 = std::time::SystemTime::now();
    // flock replaces the shell: nobody holds descriptor 9 after it, so no lease is taken.
    let (c, _, err) = outcome(plain_shell(
        &b,
        &f,
        r#"exec 9>"$F"; exec "$FLOCK" --verbose -n 9"#,
    ));
    assert_eq!(c, 0);
    assert!(
        err.starts_with(
            "flock: kernel lock only: the calling process does not hold the descriptor\n"
        ),
        "{err}"
    );
    // No lease was written (a file at its name is an earlier file's, of the same inode).
    let lease = lease_of(&f);
    assert!(
        fs::metadata(&lease).map_or(true, |m| m.modified().unwrap() < t0),
        "a lease was taken: {}",
        lease.display()
    );
    assert!(!b.path(".e.lock.leasehold-flock").exists(), "a file beside");
}
