//! The `flock` name contending with util-linux's flock on the same kernel lock, in both
//! directions; leasehold's own refusals, `status`, a frozen holder, a lost lease, and no overlap
//! between converted and unconverted users.

use super::*;

#[test]
fn waits_and_refusals_against_a_usr_bin_flock_holder() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("busy");
    let mut theirs = b.hold(Path::new(REAL), &[], &f);
    let fs_ = f.to_str().unwrap();
    let marker = b.path("must-not-run");
    let touch = ["touch", marker.to_str().unwrap()];
    let with = |pre: &[&str]| -> Vec<String> {
        pre.iter()
            .chain([fs_].iter())
            .chain(touch.iter())
            .map(|s| s.to_string())
            .collect()
    };
    // -n: at once, 1 by default or -E, silently; --verbose says why.
    assert_eq!(
        outcome(b.ours(&with(&["-n"]))),
        (1, String::new(), String::new())
    );
    assert_eq!(outcome(b.ours(&with(&["-nE", "123"]))).0, 123);
    assert_eq!(outcome(b.ours(&with(&["-w", "0"]))).0, 1);
    let (c, _, err) = outcome(b.ours(&with(&["-n", "--verbose"])));
    assert_eq!((c, err.as_str()), (1, "flock: failed to get lock\n"));
    // -w: gives up after about the time asked, with -E's status.
    let t = Instant::now();
    let (c, _, err) = outcome(b.ours(&with(&["-w", "0.3", "-E", "7"])));
    assert_eq!((c, err.as_str()), (7, ""));
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let (c, _, err) = outcome(b.ours(&with(&["--verbose", "--wait", "0.2"])));
    assert_eq!(
        (c, err.as_str()),
        (1, "flock: timeout while waiting to get lock\n")
    );
    assert!(!marker.exists(), "a refused flock ran its command");
    // Without -n it waits in the kernel for util-linux's holder, then runs.
    let mut waiter = Proc::spawn_piped(
        b.ours(&[fs_, "sh", "-c", "echo got"]).stdin(Stdio::piped()),
        "our waiter",
    );
    ensure_within("our flock to block on the kernel lock", LIMIT, || {
        blocked_in_kernel(waiter.pid(), &f)
    });
    theirs.close_stdin();
    waiter.line("got", LIMIT);
    assert_eq!(code(waiter.wait_timeout(LIMIT)), 0);
    assert_eq!(code(theirs.wait_timeout(LIMIT)), 0);
}

#[test]
fn usr_bin_flock_waits_for_and_is_refused_by_a_leasehold_holder() {
    let Some(b) = Bench::new() else { return };
    let f = users_file(&b, "job.lock");
    let before = fingerprint(&f);
    let mut ours = b.hold(&b.ours_path(), &[], &f);
    let fs_ = f.to_str().unwrap();
    assert_eq!(outcome(real(&["-n", fs_, "true"])).0, 1);
    assert_eq!(outcome(real(&["-w", "0.2", "-E", "9", fs_, "true"])).0, 9);
    // Another converted user is refused by the lease, just as silently, at once or in time.
    assert_eq!(
        outcome(b.ours(&["-w", "0.2", "-E", "9", fs_, "true"])),
        (9, String::new(), String::new())
    );
    assert_eq!(
        outcome(b.ours(&["-n", fs_, "true"])),
        (1, String::new(), String::new())
    );
    // `leasehold status FILE` finds the lease beside the file and names the holder.
    let (c, out, _) = outcome({
        let mut c = lh();
        c.arg("status").arg(&f);
        c
    });
    assert_eq!(c, 0, "{out}");
    assert!(out.contains(": held"), "{out}");
    assert!(out.contains(&format!("pid {}", ours.pid())), "{out}");
    assert!(out.contains("echo held"), "{out}");
    // util-linux's flock waits in the kernel, and runs once ours lets go.
    let mut waiter = Proc::spawn_piped(
        real(&[fs_, "sh", "-c", "echo got"]).stdin(Stdio::piped()),
        "util-linux waiter",
    );
    ensure_within(
        "util-linux flock to block on the kernel lock",
        LIMIT,
        || blocked_in_kernel(waiter.pid(), &f),
    );
    ours.close_stdin();
    waiter.line("got", LIMIT);
    assert_eq!(code(waiter.wait_timeout(LIMIT)), 0);
    assert_eq!(code(ours.wait_timeout(LIMIT)), 0);
    assert_eq!(ours.stderr(), "", "a plain run printed on stderr");
    assert_eq!(fingerprint(&f), before, "the user's file changed");
}

#[test]
fn a_lost_lease_stops_the_command_and_exits_74() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let mut c = Command::new(b.ours_path());
    c.arg(&f)
        .args(["sh", "-c", "echo held; exec sleep 60"])
        .env("LEASEHOLD_FLOCK_TTL", "1s")
        .process_group(0)
        .stderr(Stdio::piped());
    let mut p = Proc::spawn_piped(c, "flock holder");
    p.line("held", LIMIT);
    // `leasehold break FILE` finds the lease beside the user's file, as `status` does.
    let st = lh().arg("break").arg("--force").arg(&f).output().unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_eq!(code(p.wait_timeout(LIMIT)), 74);
    assert!(p.stderr().contains("flock: lease lost"), "{}", p.stderr());
    assert_eq!(
        fs::read(&f).unwrap(),
        b"",
        "the user's file was not written"
    );
    // A bad TTL is a usage error, before anything is locked.
    let (c, _, err) = outcome({
        let mut c = b.ours(&[f.to_str().unwrap(), "true"]);
        c.env("LEASEHOLD_FLOCK_TTL", "soon");
        c
    });
    assert_eq!(c, 64, "{err}");
}

#[test]
fn converted_and_unconverted_users_never_overlap() {
    let Some(b) = Bench::new() else { return };
    let cs = Cs::new(b.dir.path(), "cs");
    let f = b.path("shared.lock");
    let mut procs = Vec::new();
    for i in 0..10 {
        let id = format!("j{i}");
        let job = cs.job(&id, 3, "0.02");
        let flock = if i % 2 == 0 {
            b.ours_path()
        } else {
            PathBuf::from(REAL)
        };
        let mut c = Command::new(&flock);
        if i % 4 == 3 {
            c.args(["-w", "30"]);
        }
        c.arg(&f).args(&job).process_group(0).stdin(Stdio::null());
        procs.push(Proc::spawn(c, &id));
    }
    for p in &mut procs {
        assert_eq!(code(p.wait_timeout(Duration::from_secs(60))), 0);
    }
    let iv = cs.verify();
    assert_eq!(iv.len(), 10, "every job ran");
    assert!(iv.iter().all(|i| i.ended));
}

#[test]
fn a_frozen_holder_is_taken_over_but_its_kernel_lock_still_excludes() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let cs = Cs::new(b.dir.path(), "cs");
    let mut a = Command::new(b.ours_path());
    a.arg(&f)
        .args(cs.hold_args(&[], &f, "a")[3..].iter())
        .env("LEASEHOLD_FLOCK_TTL", "1s")
        .process_group(0)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let mut a = Proc::spawn(a, "frozen holder");
    cs.wait_entered("a", LIMIT);
    cs.allow_fenced();
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    // B takes the lease over once A has been silent for its TTL (stopping A's command), then
    // waits in the kernel: the frozen flock process still holds the kernel lock.
    let mut bj = Command::new(b.ours_path());
    bj.arg(&f)
        .args(cs.job("b", 1, "0.01"))
        .env("LEASEHOLD_FLOCK_TTL", "1s")
        .process_group(0)
        .stdin(Stdio::null());
    let mut bp = Proc::spawn(bj, "contender");
    ensure_within("the contender to wait for the kernel lock", LIMIT, || {
        blocked_in_kernel(bp.pid(), &f)
    });
    assert_eq!(
        lease_json(&lease_of(&f)).and_then(|l| l["pid"].as_i64()),
        Some(i64::from(bp.pid())),
        "the contender holds the lease"
    );
    assert!(
        !cs.entered("b"),
        "the contender ran while the frozen holder kept the lock"
    );
    a.signal(nix::sys::signal::Signal::SIGCONT);
    assert_eq!(
        code(a.wait_timeout(LIMIT)),
        74,
        "the thawed holder reports the loss"
    );
    assert_eq!(code(bp.wait_timeout(LIMIT)), 0);
    assert!(cs.entered("b"));
    cs.verify();
}

/// `flock -s`: two shared holders hold together, each with its own shared lease beside the
/// file (`leasehold status FILE --json` lists both), an exclusive `flock -n` is refused while
/// they hold, and an exclusive `flock` that waits runs once both are gone.
#[test]
fn shared_flocks_hold_together_with_a_shared_lease_each_and_exclude_an_exclusive_one() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("readers");
    let ours = b.ours_path();
    let mut r1 = b.hold(&ours, &["-s"], &f);
    let mut r2 = b.hold(&ours, &["-s"], &f);
    let out = Command::new(bin())
        .args(["status", "--json"])
        .arg(&f)
        .stdin(Stdio::null())
        .output()
        .expect("leasehold status");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let v = if v.is_array() { v[0].clone() } else { v };
    let holders = v["holders"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(holders, 2, "two shared holders, each with a lease: {v}");
    let fs_ = f.to_str().unwrap();
    assert_eq!(outcome(b.ours(&["-n", fs_, "true"])).0, 1);
    let mut writer = Proc::spawn_piped(
        b.ours(&[fs_, "sh", "-c", "echo wrote"])
            .stdin(Stdio::piped()),
        "exclusive waiter",
    );
    r1.close_stdin();
    assert_eq!(code(r1.wait_timeout(LIMIT)), 0);
    r2.close_stdin();
    assert_eq!(code(r2.wait_timeout(LIMIT)), 0);
    writer.line("wrote", LIMIT);
    assert_eq!(code(writer.wait_timeout(LIMIT)), 0);
}
