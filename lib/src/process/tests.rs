use super::*;
use std::time::Duration;

#[test]
fn parses_comm_with_parens_and_spaces() {
    let t = "42 (a) b (c) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
    let s = parse_stat(42, t, 0).unwrap();
    assert_eq!((s.state, s.ppid, s.pgrp, s.start), ('S', 1, 42, 12345));
    assert_eq!(parse_stat(1, "garbage", 0), None);
}

fn child_with_env(lock: &str, id: &str, own_group: bool) -> std::process::Child {
    let mut c = std::process::Command::new("sleep");
    c.arg("30")
        .env("LEASEHOLD_LOCK", lock)
        .env("LEASEHOLD_LEASE_ID", id);
    if own_group {
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
    }
    c.spawn().unwrap()
}

fn stat_when_execed(c: &std::process::Child) -> ProcStat {
    // Environ is the initial environment of the exec'ed program: wait for the exec to have
    // set it up (the new executable shows in /proc before the new environment does).
    for _ in 0..2000 {
        if fs::read_link(format!("/proc/{}/exe", c.id()))
            .is_ok_and(|p| p.to_string_lossy().ends_with("sleep"))
            && fs::read(format!("/proc/{}/environ", c.id())).is_ok_and(|e| !e.is_empty())
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    stat(c.id() as i32).unwrap().unwrap()
}

#[test]
fn evidence_is_bound_to_the_lock_path_and_the_lease_id() {
    let id = "0123456789abcdef0123456789abcdef";
    let uid = nix::unistd::geteuid().as_raw();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.lock"), dir.path().join("b.lock"));
    let mut job_b = child_with_env(&b.to_string_lossy(), id, true);
    let sb = stat_when_execed(&job_b);
    let mut in_our_group = child_with_env(&b.to_string_lossy(), id, false);
    let sg = stat_when_execed(&in_our_group);
    let ev_a = JobEvidence::new(id, uid, &a, &dir.path().join(".a.lock.leasehold-mutex"));
    let ev_b = JobEvidence::new(id, uid, &b, &dir.path().join(".b.lock.leasehold-mutex"));
    let other_id = JobEvidence::new(&"f".repeat(32), uid, &b, &dir.path().join("m"));
    let verdicts = (ev_a.check(&sb), ev_b.check(&sb), other_id.check(&sb));
    let ours_but_our_group = judge_group(sg.pgrp, &ev_b);
    for c in [&mut job_b, &mut in_our_group] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(
        ours_but_our_group.belongs.is_empty()
            && ours_but_our_group
                .unknown
                .iter()
                .any(|(p, _)| p.pid == sg.pid),
        "{ours_but_our_group:?}"
    );
    assert!(matches!(verdicts.0, Evidence::NotOurs(_)), "{verdicts:?}");
    assert_eq!(verdicts.1, Evidence::Belongs);
    assert!(matches!(verdicts.2, Evidence::NotOurs(_)), "{verdicts:?}");
}

#[test]
fn an_empty_environment_is_cannot_tell_never_not_ours() {
    // As a process in the middle of execve shows for a moment, or one run with `env -i`.
    let mut c = std::process::Command::new("/bin/sleep")
        .arg("30")
        .env_clear()
        .spawn()
        .unwrap();
    for _ in 0..2000 {
        if fs::read_link(format!("/proc/{}/exe", c.id()))
            .is_ok_and(|p| p.to_string_lossy().ends_with("sleep"))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = stat(c.id() as i32).unwrap().unwrap();
    let ev = JobEvidence::new(
        "0123456789abcdef0123456789abcdef",
        nix::unistd::geteuid().as_raw(),
        Path::new("/nonexistent/x.lock"),
        Path::new("/nonexistent/.x.lock.leasehold-mutex"),
    );
    let verdict = ev.check(&s);
    let _ = c.kill();
    let _ = c.wait();
    assert!(matches!(verdict, Evidence::Unknown(_)), "{verdict:?}");
}

#[test]
fn this_process_and_its_ancestors_are_never_judged_signallable() {
    let uid = nix::unistd::geteuid().as_raw();
    let ev = JobEvidence::new(
        "x",
        uid,
        Path::new("/nonexistent"),
        Path::new("/nonexistent"),
    );
    let me = stat(std::process::id() as i32).unwrap().unwrap();
    // Our environment does not carry the lease: plainly not ours.
    assert!(matches!(ev.check(&me), Evidence::NotOurs(_)));
    assert!(is_self_or_ancestor(me.pid));
    assert!(is_self_or_ancestor(me.ppid));
    assert!(kill_checked(me.pid, me.start, Duration::from_millis(1)).is_err());
}

#[test]
fn own_process_is_alive_and_reuse_is_detected() {
    let me = std::process::id() as i32;
    let start = own_start_time();
    assert_eq!(liveness(me, start), Liveness::Alive);
    assert!(matches!(liveness(me, start + 1), Liveness::Dead(_)));
}
