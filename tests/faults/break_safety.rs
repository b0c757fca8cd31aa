//! Breaks that never overlap, and signals only on evidence bound to this lock:
//! - `break --force` / `break --lease-id` of a live `leasehold run` holder revokes its lease: a
//!   contender started right after the break runs only once the old job is gone (both jobs are
//!   checked by the shared critical-section checker, `support::cs`), and the old run exits 74;
//! - a revoked lease of a foreign holder blocks a contender for a TTL from the break;
//! - a lease copied from another lock, and forged leases naming the contender's own process
//!   group or its parent, get nobody signalled;
//! - `break --force` replaces a forged lease naming pid 1 (or an unrelated process of the
//!   test's own, which would die of a signal or show a stop) at once, signalling nothing;
//! - (root) a stale lease whose remnant runs as another user is refused by a non-root
//!   contender ("cannot be checked", exit 75, remnant left alive) and stopped, verified, by root.

use crate::support;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Cs, Proc};
use leasehold::{BreakMode, Identity, LeaseBuilder, LeaseState, State};

fn lh() -> Command {
    let mut c = Command::new(support::bin());
    c.stdin(Stdio::null());
    c
}

fn out(mut c: Command) -> (i32, String) {
    let o = c.output().expect("run leasehold");
    (
        support::code(o.status),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn raw(lock: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(lock).expect("read LOCK")).expect("LOCK is JSON")
}

/// Waits until LOCK names a command (`child_pid`), and returns (lease id, child pid, pgid).
fn wait_for_child(lock: &Path) -> (String, i32, i32) {
    let mut found = None;
    assert!(
        support::wait_until(Duration::from_secs(10), || {
            let Ok(b) = fs::read(lock) else { return false };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) else {
                return false;
            };
            let (Some(id), Some(c), Some(g)) = (
                v["lease_id"].as_str(),
                v["holder"]["child_pid"].as_i64(),
                v["holder"]["pgid"].as_i64(),
            ) else {
                return false;
            };
            found = Some((id.to_string(), c as i32, g as i32));
            true
        }),
        "no command recorded in {}",
        lock.display()
    );
    found.unwrap()
}

/// A held lease record for this host, forged by hand.
fn forged(pid: i32, start: u64, pgid: Option<i32>, ttl: Duration) -> Vec<u8> {
    let mut l = support::crafted(pid, start, &Identity::current(), ttl, 7);
    l.lease_id = "00112233445566778899aabbccddeeff".into();
    l.holder.pgid = pgid;
    l.holder.command = vec!["forged".into()];
    l.holder.note = None;
    l.to_bytes()
}

fn start_of(pid: i32) -> u64 {
    support::start_time(pid).expect("process exists")
}

#[test]
fn break_force_and_lease_id_of_a_live_run_never_let_the_next_job_overlap_it() {
    for by_id in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("job.lock");
        let cs = Cs::new(d.path(), "cs");
        let mut old = Proc::spawn(
            lh().args(cs.hold_args(&["--ttl", "3s"], &lock, "old"))
                .stderr(Stdio::piped()),
            "old run",
        );
        let (id, child, _) = wait_for_child(&lock);
        cs.wait_entered("old", Duration::from_secs(10));
        // The break fences the old job: its `inside` may be replaced once it is dead.
        cs.declare_killed("old");
        let mut brk = lh();
        brk.arg("break");
        if by_id {
            brk.args(["--lease-id", &id]);
        } else {
            brk.arg("--force");
        }
        brk.arg(&lock);
        let (code, said) = out(brk);
        println!("break (by id: {by_id}): exit {code}: {}", said.trim());
        assert_eq!(code, 0, "{said}");
        assert!(said.contains("revoked"), "{said}");
        assert!(said.contains("frees when its processes are gone"), "{said}");
        assert_eq!(raw(&lock)["state"], "revoked");
        // A contender right after the break: it must wait for the old job to be gone.
        let t = Instant::now();
        let mut next = Proc::spawn(
            lh().args(cs.run_args(&["-q", "-w", "30s"], &lock, "next", 1))
                .stderr(Stdio::piped()),
            "next run",
        );
        let st = old.wait_timeout(Duration::from_secs(15));
        assert_eq!(support::code(st), 74, "the old run must fence and exit 74");
        assert!(!support::alive(child), "the old command survived its fence");
        let st = next.wait_timeout(Duration::from_secs(30));
        let err = next.stderr();
        assert_eq!(support::code(st), 0, "next run: {err}");
        let jobs = cs.verify();
        assert_eq!(jobs.len(), 2, "both jobs entered: {jobs:?}");
        assert!(cs.ended("next"), "the next job ran to its end");
        println!(
            "next job ran after the old one ended ({:?} after the break)",
            t.elapsed()
        );
    }
}

#[test]
fn a_revoked_foreign_lease_blocks_a_contender_for_a_ttl_from_the_break() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("job.lock");
    let ttl = Duration::from_millis(1200);
    let mut foreign = Identity::current();
    foreign.host = "elsewhere".into();
    foreign.boot_id = "not-this-boot".into();
    let g = LeaseBuilder::new(&lock)
        .ttl(ttl)
        .identity(foreign)
        .try_acquire()
        .unwrap();
    let b = leasehold::break_lease(&lock, BreakMode::Force).unwrap();
    let broke = Instant::now();
    assert_eq!(b.written, LeaseState::Revoked);
    assert_eq!(b.frees, leasehold::Frees::AfterTtl { ttl });
    println!(
        "break: {}",
        leasehold_cli::cli::report::broken_line(&b).trim_end()
    );
    assert!(
        support::wait_until(Duration::from_secs(3), || g.is_lost()),
        "the holder must find its lease revoked at its next renewal"
    );
    // Its processes are on "another host": never released, never visible.
    std::mem::forget(g);
    let v = leasehold::status(&lock).unwrap();
    assert_eq!(v.state, State::Held, "{v}");
    let next = LeaseBuilder::new(&lock)
        .ttl(ttl)
        .acquire_timeout(ttl * 4)
        .expect("taken after a TTL");
    let waited = broke.elapsed();
    println!("contender took the revoked lease {waited:?} after the break (TTL {ttl:?})");
    assert!(
        waited >= ttl,
        "taken {waited:?} after the break, before a TTL"
    );
    assert!(next.token() > b.verdict.lease.as_ref().unwrap().token);
    next.release().unwrap();
}

#[test]
fn a_lease_copied_from_another_lock_never_gets_that_locks_job_signalled() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a.lock"), d.path().join("b.lock"));
    let mut job_a = Proc::spawn(
        lh().args(["run", "--ttl", "1s"])
            .arg(&a)
            .args(["--", "sleep", "600"])
            .stderr(Stdio::null()),
        "job of a.lock",
    );
    let (_, child_a, _) = wait_for_child(&a);
    fs::copy(&a, &b).unwrap();
    // A contender of b.lock: the copy's heartbeat never moves, so after its TTL it is judged
    // hung, and its processes must prove they are b.lock's before anything is signalled.
    let (code, said) = out({
        let mut c = lh();
        c.args(["run", "-w", "3s", "--ttl", "1s"])
            .arg(&b)
            .args(["--", "true"]);
        c
    });
    println!("contender of the copy: exit {code}: {}", said.trim());
    assert_eq!(code, 75, "{said}");
    assert!(
        support::not_signalled(child_a),
        "a.lock's job was signalled"
    );
    assert!(job_a.try_wait().is_none(), "a.lock's wrapper died");
    // break --force on the copy: replaced at once, nothing signalled.
    let (code, said) = out({
        let mut c = lh();
        c.args(["break", "--force"]).arg(&b);
        c
    });
    println!("break --force of the copy: exit {code}: {}", said.trim());
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("forged or copied"), "{said}");
    assert_eq!(raw(&b)["state"], "released");
    assert!(
        support::not_signalled(child_a),
        "a.lock's job was signalled"
    );
    assert_eq!(leasehold::status(&a).unwrap().state, State::Held);
    job_a.kill();
}

#[test]
fn a_forged_lease_naming_the_contenders_own_group_or_parent_signals_nobody() {
    let ttl = Duration::from_millis(300);
    // (what, lease naming the parent shell as holder, pgid = the shell's own group)
    for parent_is_holder in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("job.lock");
        let rc = d.path().join("rc");
        // A shell in a group of its own that starts the contender once told to: the contender
        // is its child, in its group.
        let script = format!(
            "read go; '{bin}' run -w 3s --ttl 300ms '{lock}' -- true; echo $? > '{rc}'",
            bin = support::bin().display(),
            lock = lock.display(),
            rc = rc.display()
        );
        let mut c = Command::new("sh");
        c.args(["-c", &script]).stdin(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let mut sh = Proc::spawn(&mut c, "parent shell");
        let pid = sh.pid();
        let holder = if parent_is_holder {
            (pid, start_of(pid))
        } else {
            (dead_pid(), 1)
        };
        fs::write(&lock, forged(holder.0, holder.1, Some(pid), ttl)).unwrap();
        let mut stdin = sh.child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        let st = sh.wait_timeout(Duration::from_secs(20));
        assert!(st.success(), "the parent shell was signalled: {st:?}");
        let code: i32 = fs::read_to_string(&rc).unwrap().trim().parse().unwrap();
        println!("forged lease (holder is the parent: {parent_is_holder}): contender exit {code}");
        assert!(
            code == 0 || code == 75,
            "the contender was signalled or failed: exit {code}"
        );
    }
}

#[test]
fn break_force_replaces_a_lease_naming_pid_1_or_an_unrelated_process_signalling_nothing() {
    let ttl = Duration::from_millis(500);
    // A process of our own, which would visibly die of a SIGKILL.
    let mut c = Command::new("sleep");
    c.arg("600");
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let mut victim = Proc::spawn(&mut c, "victim");
    let vp = victim.pid();
    let mut cases = vec![(
        "an unrelated process of ours",
        forged(vp, start_of(vp), Some(vp), ttl),
    )];
    // Forged as root's (pid 1's uid), as the lease naming it would be. Pid 1 ignores signals it
    // has no handler for, so it cannot witness "nothing was signalled"; the victim of our own,
    // in its own group and running as the same user, does.
    if !support::skip(
        !support::is_root(),
        "the pid 1 case needs root (pid 1's /proc is unreadable otherwise)",
    ) {
        let init = support::start_time(1).expect("pid 1's start time");
        cases.push(("pid 1", forged(1, init, None, ttl)));
    }
    for (what, bytes) in cases {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("job.lock");
        fs::write(&lock, bytes).unwrap();
        let (code, said) = out({
            let mut c = lh();
            c.args(["break", "--force"]).arg(&lock);
            c
        });
        println!(
            "break --force of a lease naming {what}: exit {code}: {}",
            said.trim()
        );
        assert_eq!(code, 0, "{what}: {said}");
        assert!(said.contains("not a holder of this lock"), "{what}: {said}");
        assert!(said.contains("without signalling"), "{what}: {said}");
        assert_eq!(raw(&lock)["state"], "released", "{what}");
        let (code, said) = out({
            let mut c = lh();
            c.args(["run", "-n"]).arg(&lock).args(["--", "true"]);
            c
        });
        assert_eq!(code, 0, "{what}: the lock is not usable: {said}");
        assert!(
            victim.try_wait().is_none() && support::running(vp),
            "{what}: the victim was signalled (state {:?})",
            support::proc_state(vp)
        );
    }
    victim.kill();
}

fn dead_pid() -> i32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    c.wait().unwrap();
    pid
}

fn as_uid(uid: u32, bin: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(bin)
        .stdin(Stdio::null());
    c
}

#[test]
fn a_remnant_of_another_users_job_is_refused_unchecked_and_stopped_by_root() {
    if support::need_root() {
        return;
    }
    if support::need_tools(&["setpriv", "sh", "sleep"]) {
        return;
    }
    // The binary where other users can execute it.
    let bindir = support::tmp_dir_with_mode("break-safety-", 0o755);
    let bin: PathBuf = bindir.path().join("leasehold");
    fs::copy(support::bin(), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let d = support::tmp_dir_with_mode("break-safety-", 0o777);
    let lock = d.path().join("job.lock");
    let pidfile = d.path().join("remnant.pid");
    // The old job, as nobody: its command leaves a grandchild in its group.
    let mut job = Proc::spawn(
        as_uid(65534, &bin)
            .args(["run", "--ttl", "1s"])
            .arg(&lock)
            .args(["--", "sh", "-c"])
            .arg(format!(
                "sleep 600 & echo $! > '{}'; wait",
                pidfile.display()
            ))
            .stderr(Stdio::null()),
        "old job as nobody",
    );
    let (_, child, pgid) = wait_for_child(&lock);
    let wrapper = job.pid(); // setpriv execs leasehold
    assert!(support::wait_until(Duration::from_secs(10), || {
        fs::read_to_string(&pidfile).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    }));
    // Its guardian goes first (as under the OOM killer), or it would stop the remnant itself.
    support::kill_guardian(wrapper);
    let remnant: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The wrapper dies; its command dies with it (PDEATHSIG); the grandchild stays behind, its
    // guardian gone.
    job.kill();
    assert!(support::wait_until(Duration::from_secs(5), || {
        !support::alive(child)
    }));
    assert!(support::alive(remnant));
    assert_eq!(support::pgrp(remnant).expect("the remnant's group"), pgid);
    // A contender of another non-root uid cannot read the remnant's /proc: refused, not blind.
    let (code, said) = out({
        let mut c = as_uid(4242, &bin);
        c.args(["run", "-n", "--ttl", "1s"])
            .arg(&lock)
            .args(["--", "true"]);
        c
    });
    println!("contender as uid 4242: exit {code}: {}", said.trim());
    assert_eq!(code, 75, "{said}");
    assert!(said.contains("cannot be checked"), "{said}");
    assert!(said.contains(&format!("pid {remnant}")), "{said}");
    assert!(support::not_signalled(remnant), "the remnant was signalled");
    assert_eq!(raw(&lock)["state"], "held", "LOCK changed");
    // Root can read it: the remnant is this lock's job; stopped (verified), then taken over.
    let (code, said) = out({
        let mut c = lh();
        c.args(["run", "-n", "--ttl", "1s"])
            .arg(&lock)
            .args(["--", "true"]);
        c
    });
    println!("contender as root: exit {code}: {}", said.trim());
    assert_eq!(code, 0, "{said}");
    assert!(
        support::wait_until(Duration::from_secs(5), || !support::alive(remnant)),
        "the remnant survived"
    );
}
