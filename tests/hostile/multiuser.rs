//! Several users on one lock, and users attacking root's or each other's use of it.
//!
//! Root only (CI runs as root): each test makes a throwaway group and users, runs leasehold as
//! them with `setpriv` and a chosen umask, and removes them at the end. Every test checks that
//! planted targets are unchanged (bytes, mode, owner, mtime, link count), that no process outside
//! the jobs received a signal (bystanders of root and of each user trap every catchable signal),
//! and, where jobs run, that no two jobs overlapped (the O_EXCL critical-section checker,
//! `support::cs`). The checks every test starts and ends with are `harness::Scene`'s.
//!
//! - Group-shared (setgid 2775) directory: members share a lock under umask 022 and 002, take
//!   over from each other's SIGKILLed holders, and 100 alternating runs with random SIGKILLs
//!   inside the critical section never overlap and always recover.
//! - Sticky (1777) directory: another user's lock is either usable or refused at once, naming
//!   its owner — never after waiting through the job.
//! - Hard links and symlinks planted at the helper names, and a symlinked queue directory: root's
//!   `run`, `status` and `break` leave the victims alone and never fail with exit 70.
//! - A forged observation file does not get a healthy holder killed or a live foreign one broken.
//! - The mutex or a queue ticket held by another user's process: the waiter names that process
//!   and user, and keeps its `-w`.
//! - Directories, FIFOs and sockets squatting the helper names: a clear refusal, never 70 or a
//!   hang.
//! - Another user's job left a process behind: a takeover does not run beside it.

use super::harness;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::Cs;
use harness::{
    LONG, LinkProtectionsOff, Outcome, Scene, Snapshot, Who, World, describe, first_line, wait_line,
};
use nix::sys::signal::Signal;

/// A small xorshift PRNG; the seed is printed so a run can be replayed with `MULTIUSER_SEED`.
struct Rng(u64);

impl Rng {
    fn new(test: &str) -> Rng {
        let seed = std::env::var("MULTIUSER_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{test}: seed {seed} (replay with MULTIUSER_SEED={seed})");
        Rng(seed | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

pub(super) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `leasehold run PRE LOCK -- true`.
pub(super) fn run_true<'a>(pre: &[&'a str], lock: &'a Path) -> Vec<&'a str> {
    let mut v = vec!["run"];
    v.extend(pre);
    v.extend([s(lock), "--", "true"]);
    v
}

/// The helper names beside `lock` that an attacker can plant something at, with a label: the
/// mutex, the fixed temp name and a random-form one, the shared observation file and the one of
/// each uid in `seen_uids`, and the first queue ticket with its prepared lease.
fn helper_names(lock: &Path, seen_uids: &[u32]) -> Vec<(String, PathBuf)> {
    let dir = lock.parent().unwrap();
    let name = lock.file_name().unwrap().to_str().unwrap();
    let h = |suffix: &str| dir.join(format!(".{name}.leasehold-{suffix}"));
    let queue = h("queue");
    let mut v = vec![
        ("mutex".to_string(), h("mutex")),
        ("temp file".to_string(), h("tmp")),
        (
            "random temp file name".to_string(),
            h("tmp-0123456789abcdef"),
        ),
        ("shared observation file".to_string(), h("seen")),
    ];
    for uid in seen_uids {
        v.push((
            format!("observation file of uid {uid}"),
            h(&format!("seen-{uid}")),
        ));
    }
    v.push(("queue ticket".into(), queue.join("q-00000000000000000001")));
    v.push((
        "prepared lease".into(),
        queue.join("q-00000000000000000001.lease"),
    ));
    v
}

/// [`helper_names`] of a lock `job.lock`-like name under `base`, relative to `base`.
fn relative_helper_names(base: &Path, lock: &str, seen_uids: &[u32]) -> Vec<(String, PathBuf)> {
    helper_names(&base.join(lock), seen_uids)
        .into_iter()
        .map(|(l, p)| (l, p.strip_prefix(base).unwrap().to_path_buf()))
        .collect()
}

/// The queue directory's name beside `lock`.
fn queue_dir(lock: &Path) -> PathBuf {
    let name = lock.file_name().unwrap().to_str().unwrap();
    lock.parent()
        .unwrap()
        .join(format!(".{name}.leasehold-queue"))
}

/// Whether a refusal's message names `path` (by its full path or at least its file name).
fn names_path(text: &str, path: &Path) -> bool {
    text.contains(s(path)) || text.contains(&*path.file_name().unwrap().to_string_lossy())
}

// ---------------------------------------------------------------------------------------------
// 1. Group-shared directory
// ---------------------------------------------------------------------------------------------

/// Members of a group share a lock in a setgid, group-writable directory with no extra flag,
/// whatever umask each has and whichever of them created the lock: alone, waiting for each
/// other (the waiter queues), and with `-n`; no two jobs overlap.
#[test]
fn group_members_share_a_lock_under_umask_022_and_002() {
    let Some(sc) = Scene::new("group_members_share_a_lock_under_umask_022_and_002") else {
        return;
    };
    let w = &sc.w;
    let mut case = 0;
    for (first, second) in [(&w.a, &w.b), (&w.b, &w.a)] {
        for (u1, u2) in [
            (0o022, 0o022),
            (0o022, 0o002),
            (0o002, 0o022),
            (0o002, 0o002),
        ] {
            case += 1;
            let label = format!(
                "{} (umask {u1:03o}) created, {} (umask {u2:03o}) joined",
                first.name, second.name
            );
            let lock = sc.lock_in(&format!("shared-{case}"), 0o2775);
            let cs = Cs::new(&w.base, &format!("cs-{case}"));
            let (x, y) = (Who::User(first), Who::User(second));
            let ttl = ["-w", "20", "--ttl", "2s"];
            // 1. The creator runs alone.
            let o = sc.run_as(x, u1, &cs.run_args(&ttl, &lock, "1", 2));
            sc.expect_ok(&o, format!("{label}: creator's first run"));
            // 2 and 3. Each holds while the other waits for it.
            for (step, (h, hu, c, cu)) in [(x, u1, y, u2), (y, u2, x, u1)].into_iter().enumerate() {
                let hid = format!("hold{step}");
                let cid = format!("wait{step}");
                let secs20 = Duration::from_secs(20);
                let mut holder = match sc.hold(&cs, h, hu, &ttl, &lock, &hid, secs20) {
                    Ok(holder) => holder,
                    Err(o) => {
                        sc.expect(false, &o, format!("{label}: {} could not hold", h.name()));
                        continue;
                    }
                };
                let mut waiter = sc.spawn_as(c, cu, &cs.run_args(&ttl, &lock, &cid, 2));
                let line = wait_line(&waiter, secs20);
                sc.check(line.is_some(), || {
                    format!(
                        "{label}: {} printed no wait line while {} held: {:?}",
                        c.name(),
                        h.name(),
                        waiter.stderr_so_far()
                    )
                });
                cs.release(&hid);
                let ho = holder.finish(LONG);
                let wo = waiter.finish(LONG);
                sc.expect_ok(&ho, format!("{label}: holder {}", h.name()));
                sc.expect(
                    wo.code == 0 && cs.ended(&cid),
                    &wo,
                    format!("{label}: waiter {}", c.name()),
                );
            }
            // 4. The joiner alone with -n.
            let o = sc.run_as(y, u2, &cs.run_args(&["-n"], &lock, "4", 1));
            sc.expect_ok(&o, format!("{label}: joiner's -n run"));
            cs.verify();
        }
    }
    sc.finish();
}

/// A member whose holder was SIGKILLed mid-job (its job inside the critical section) is taken
/// over by another member waiting on the same lock, under umask 022 and 002; the killed job is
/// dead before the new one enters, and the first member can use the lock again afterwards.
#[test]
fn group_member_takes_over_from_another_members_killed_holder() {
    let Some(sc) = Scene::new("group_member_takes_over_from_another_members_killed_holder") else {
        return;
    };
    for umask in [0o022, 0o002] {
        let lock = sc.lock_in(&format!("takeover-{umask:o}"), 0o2775);
        let cs = Cs::new(&sc.w.base, &format!("cs-takeover-{umask:o}"));
        let ttl = ["-w", "20", "--ttl", "2s"];
        let mut holder = sc.spawn_as(sc.a(), umask, &cs.hold_args(&ttl, &lock, "a"));
        cs.wait_entered("a", Duration::from_secs(20));
        let mut waiter = sc.spawn_as(sc.b(), umask, &cs.run_args(&ttl, &lock, "b", 3));
        let line = wait_line(&waiter, Duration::from_secs(20));
        sc.check(line.is_some(), || {
            format!(
                "umask {umask:03o}: B printed no wait line: {:?}",
                waiter.stderr_so_far()
            )
        });
        cs.declare_killed("a");
        holder.signal(Signal::SIGKILL);
        let ho = holder.finish(LONG);
        assert_eq!(ho.code, 137, "the holder was SIGKILLed");
        sc.check(!cs.ended("a"), || {
            "the kill did not land inside the section".into()
        });
        let wo = waiter.finish(LONG);
        sc.expect(
            wo.code == 0 && cs.ended("b"),
            &wo,
            format!("umask {umask:03o}: B's takeover"),
        );
        let o = sc.run_as(sc.a(), umask, &cs.run_args(&["-n"], &lock, "a2", 1));
        sc.expect_ok(&o, format!("umask {umask:03o}: A after B's takeover"));
        cs.verify();
    }
    sc.finish();
}

/// Another member's `break --force` replaces LOCK with a revoked record of its own, which the
/// holder may read but not write (umask 022): the holder still finds its lease broken at its
/// next renewal, says so and who broke it, and fences — not later, at its renew deadline, with
/// a permission error, while `break` told the operator "at its next renewal".
#[test]
fn another_members_break_fences_the_holder_at_its_next_renewal() {
    let Some(sc) = Scene::new("another_members_break_fences_the_holder_at_its_next_renewal") else {
        return;
    };
    let lock = sc.lock_in("cross-break", 0o2775);
    let l = s(&lock);
    let mut holder = sc.spawn_as(
        sc.a(),
        0o022,
        &["run", "--ttl", "3s", l, "--", "sleep", "60"],
    );
    crate::support::wait_for_child(&lock);
    let o = sc.run_as(sc.b(), 0o022, &["break", "--force", l]);
    sc.expect(
        o.code == 0 && o.stderr.contains("at its next renewal"),
        &o,
        "B's break",
    );
    let ho = holder.finish(LONG);
    sc.expect(
        ho.code == 74 && ho.stderr.contains("lease broken: revoked by "),
        &ho,
        "A fenced at its next renewal, saying who broke its lease",
    );
    sc.check(!ho.stderr.contains("Permission denied"), || {
        format!("A fenced at its deadline: {}", describe(&ho))
    });
    sc.finish();
}

/// Two members alternate 100 runs (`-w 20 --ttl 2s`, some `-n`, two at a time), and holders are
/// SIGKILLed at random inside the critical section: every run exits 0 or 75 or is the killed one,
/// no two jobs overlap, the lock always recovers by itself and the final run succeeds. Half the
/// runs on a lock created under umask 022, half under 002, each run with a random umask.
#[test]
fn group_members_alternating_with_random_sigkills_never_overlap_and_recover() {
    let test = "group_members_alternating_with_random_sigkills_never_overlap_and_recover";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let w = &sc.w;
    let mut rng = Rng::new(test);
    let started = Instant::now();
    let (mut ran, mut refused, mut killed_inside, mut runs) = (0, 0, 0, 0);
    let mut reasons: Vec<String> = Vec::new();
    for creator_umask in [0o022u32, 0o002] {
        let lock = sc.lock_in(&format!("alt-{creator_umask:o}"), 0o2775);
        let cs = Cs::new(&w.base, &format!("cs-alt-{creator_umask:o}"));
        let o = sc.run_as(
            sc.a(),
            creator_umask,
            &cs.run_args(&["-n", "--ttl", "2s"], &lock, "create", 1),
        );
        runs += 1;
        sc.expect_ok(&o, "creating the lock");
        for round in 0..25 {
            let users = if round % 2 == 0 {
                [&w.a, &w.b]
            } else {
                [&w.b, &w.a]
            };
            let mut procs = Vec::new();
            for (i, u) in users.into_iter().enumerate() {
                let id = format!("{round}{}", ["x", "y"][i]);
                let umask = [0o022, 0o002][rng.below(2) as usize];
                let pre: Vec<&str> = if i == 1 && rng.below(10) < 3 {
                    vec!["-n", "--ttl", "2s"]
                } else {
                    vec!["-w", "20", "--ttl", "2s"]
                };
                let p = sc.spawn_as(Who::User(u), umask, &cs.run_args(&pre, &lock, &id, 10));
                procs.push((id, p, u.name.clone(), umask, pre[0]));
            }
            runs += 2;
            let mut killed = None;
            if rng.below(100) < 40 {
                // Kill whichever job enters first, after 0-3 of its ticks.
                let mut first = None;
                harness::wait_until(Duration::from_secs(25), || {
                    first = procs.iter().position(|(id, ..)| cs.entered(id));
                    first.is_some()
                        || procs
                            .iter_mut()
                            .all(|(_, p, ..)| p.child.try_wait().unwrap().is_some())
                });
                if let Some(k) = first {
                    let id = procs[k].0.clone();
                    let ticks = rng.below(4) as usize;
                    harness::wait_until(Duration::from_secs(5), || {
                        cs.ticks(&id) >= ticks || cs.ended(&id)
                    });
                    cs.declare_killed(&id);
                    procs[k].1.signal(Signal::SIGKILL);
                    killed = Some(k);
                }
            }
            let mut summary = Vec::new();
            let mut stalled = false;
            for (k, (id, p, who, umask, mode)) in procs.iter_mut().enumerate() {
                let o = p.finish(LONG);
                summary.push(format!("{id}({who} {mode} {umask:03o})={}", o.code));
                if killed == Some(k) {
                    if !cs.ended(id) && o.code == 137 {
                        killed_inside += 1;
                    }
                    sc.expect(
                        o.code == 137 || o.code == 0,
                        &o,
                        format!("round {round}: killed run {id} of {who}"),
                    );
                    continue;
                }
                match o.code {
                    0 => {
                        ran += 1;
                        sc.check(cs.ended(id), || {
                            format!("round {round}: run {id} exited 0 but its job did not end")
                        });
                    }
                    75 => {
                        refused += 1;
                        let first = o.stderr.lines().last().unwrap_or("").to_string();
                        if *mode == "-w" && reasons.len() < 6 && !reasons.contains(&first) {
                            reasons.push(first);
                        }
                        // A waiter that waited out its whole -w: the lock did not recover.
                        stalled |= *mode == "-w" && o.took >= Duration::from_secs(19);
                    }
                    _ => sc.expect(
                        false,
                        &o,
                        format!("round {round}: run {id} of {who} (umask {umask:03o})"),
                    ),
                }
            }
            eprintln!(
                "{test}: round {round}{}: {}",
                killed
                    .map(|k| format!(" (killed {})", procs[k].0))
                    .unwrap_or_default(),
                summary.join(" ")
            );
            if stalled {
                sc.check(false, || {
                    format!(
                        "lock created under umask {creator_umask:03o}: round {round}: a waiter \
                         waited out -w 20: the lock did not recover; stopping this phase"
                    )
                });
                break;
            }
        }
        let o = sc.run_as(
            sc.b(),
            0o022,
            &cs.run_args(&["-w", "20", "--ttl", "2s"], &lock, "final", 1),
        );
        runs += 1;
        sc.expect_ok(
            &o,
            format!("lock created under umask {creator_umask:03o}: the final run"),
        );
        let iv = cs.verify();
        eprintln!(
            "{test}: creator umask {creator_umask:03o}: {} jobs entered, none overlapped",
            iv.len()
        );
    }
    eprintln!(
        "{test}: {runs} runs: {ran} ran, {refused} got 75, {killed_inside} SIGKILLed inside the \
         critical section; {:?}",
        started.elapsed()
    );
    eprintln!("{test}: why waiters (-w) got 75: {reasons:#?}");
    sc.check(killed_inside > 0, || {
        "no holder was killed inside its critical section".into()
    });
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// 2. Sticky directory
// ---------------------------------------------------------------------------------------------

/// In a sticky directory (1777, like /tmp) user B's `run -w 30` on user A's lock either works
/// (after A's job) or is refused at once — exit 65 or 77, naming A — never after waiting
/// through A's job; the same when A's lease is released.
#[test]
fn sticky_directory_other_users_lock_works_or_is_refused_at_once() {
    let test = "sticky_directory_other_users_lock_works_or_is_refused_at_once";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let (w, cs) = (&sc.w, &sc.cs);
    let decide = Duration::from_secs(5);
    // Held by A.
    let lock = sc.lock_in("sticky-held", 0o1777);
    let mut holder = sc.spawn_as(sc.a(), 0o022, &cs.hold_args(&[], &lock, "a"));
    cs.wait_entered("a", Duration::from_secs(20));
    let mut b = sc.spawn_as(sc.b(), 0o022, &cs.run_args(&["-w", "30"], &lock, "b", 1));
    let decided = b.wait_within(decide);
    eprintln!(
        "{test}: B against A's held lock: {}",
        if decided.is_some() {
            "refused at once"
        } else {
            "waits"
        }
    );
    match decided {
        Some(_) => {
            let o = b.finish(LONG);
            eprintln!("{test}: B while A holds: {}", first_line(&o));
            sc.expect(
                (o.code == 65 || o.code == 77) && o.stderr.contains(&w.a.name),
                &o,
                format!("held: B refused but not with 65/77 naming {}", w.a.name),
            );
            sc.check(!cs.ended("a"), || {
                "A's job ended before B was refused".into()
            });
            cs.release("a");
        }
        None => {
            // B waits: it must get the lock once A's job ends.
            cs.release("a");
            let o = b.finish(LONG);
            sc.expect(
                o.code == 0 && cs.ended("b"),
                &o,
                "held: B waited through A's job and then",
            );
        }
    }
    let o = holder.finish(LONG);
    sc.expect_ok(&o, "A's holder");

    // Released by A.
    let lock = sc.lock_in("sticky-free", 0o1777);
    let o = sc.run_as(sc.a(), 0o022, &cs.run_args(&[], &lock, "a2", 1));
    sc.expect_ok(&o, "A creating the lock");
    let o = sc.run_as(sc.b(), 0o022, &cs.run_args(&["-w", "30"], &lock, "b2", 1));
    eprintln!("{test}: B after A released: {}", first_line(&o));
    sc.expect(
        o.code == 0 && cs.ended("b2")
            || (o.code == 65 || o.code == 77) && o.stderr.contains(&w.a.name) && o.took < decide,
        &o,
        "released: B neither ran nor was refused at once naming A",
    );
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// 3 and 4. Hard links and symlinks at helper names
// ---------------------------------------------------------------------------------------------

/// The victims of the link attacks: a root-owned copy of /etc/passwd (0644) and a file of user
/// B (0600 in B's 0711 directory), both reachable by path by user A.
fn victims(w: &World, n: usize) -> Vec<(&'static str, PathBuf)> {
    let vd = w.dir(&format!("victims-{n}"), 0o755, Who::Root);
    fs::set_permissions(&vd, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&vd, Some(0), Some(0)).unwrap();
    let root_victim = vd.join("passwd-copy");
    fs::copy("/etc/passwd", &root_victim).unwrap();
    harness::chmod(&root_victim, 0o644);
    let bd = w.dir(&format!("b-home-{n}"), 0o711, Who::User(&w.b));
    let b_victim = bd.join("secret");
    fs::write(&b_victim, "B's private data\n").unwrap();
    std::os::unix::fs::chown(&b_victim, Some(w.b.uid), Some(w.gid)).unwrap();
    harness::chmod(&b_victim, 0o600);
    vec![("root's file", root_victim), ("B's file", b_victim)]
}

/// The foreign host a test's library holder plays.
fn foreign_identity() -> leasehold::Identity {
    let mut id = leasehold::Identity::current();
    id.host = format!("elsewhere-{}", std::process::id());
    id.boot_id = "00000000-0000-4000-8000-000000000000".into();
    id
}

/// Root's commands against `lock`, each judged by `judge(what, codes a success may have, how it
/// ended)`, in three situations that between them use every helper file:
/// - the lock is free: `run LOCK -- true`, `status`, `break`;
/// - a live holder on another host (the library, renewing) holds it, so root observes it and
///   writes its observation file: `run -n`, `status`, `break`;
/// - root holds it and another root `run -w` queues behind (a ticket, a prepared lease), then
///   takes it.
fn root_scenarios(sc: &Scene, lock: &Path, mut judge: impl FnMut(&str, &[i32], &Outcome)) {
    let limit = Duration::from_secs(30);
    for (what, a, codes) in [
        ("run, free", run_true(&[], lock), &[0][..]),
        ("status, free", vec!["status", s(lock)], &[0]),
        ("break, free", vec!["break", s(lock)], &[0, 75]),
    ] {
        let o = sc.run_within(Who::Root, 0o022, &a, limit);
        judge(what, codes, &o);
    }
    match leasehold::LeaseBuilder::new(lock)
        .ttl(Duration::from_secs(2))
        .identity(foreign_identity())
        .try_acquire()
    {
        Ok(guard) => {
            for (what, a, codes) in [
                ("run -n, foreign holder", run_true(&["-n"], lock), &[75][..]),
                ("status, foreign holder", vec!["status", s(lock)], &[0]),
                ("break, foreign holder", vec!["break", s(lock)], &[75]),
            ] {
                let o = sc.run_within(Who::Root, 0o022, &a, limit);
                judge(what, codes, &o);
            }
            drop(guard);
        }
        // The library refuses only as `run` would: 65/77 naming the planted file.
        Err(e) => judge(
            "foreign holder (the library, as root)",
            &[0],
            &library_outcome(&e),
        ),
    }
    static HOLDERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let id = format!(
        "h{}",
        HOLDERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    match sc.hold(&sc.cs, Who::Root, 0o022, &["--ttl", "2s"], lock, &id, limit) {
        Ok(mut holder) => {
            let mut waiter = sc.spawn_as(Who::Root, 0o022, &run_true(&["-w", "10"], lock));
            let waited = wait_line(&waiter, limit).is_some();
            sc.cs.release(&id);
            let o = holder.finish(LONG);
            judge("holder, contended", &[0], &o);
            let o = waiter.finish(LONG);
            judge("waiter, contended", &[0], &o);
            sc.check(waited || o.code != 0, || {
                format!(
                    "root's waiter neither said it waits nor was refused: {}",
                    describe(&o)
                )
            });
        }
        Err(o) => judge("holder, contended", &[0], &o),
    }
}

/// How a library call that failed with `e` would have ended as a `leasehold` run: its exit
/// status and its error line (for the same judges as a run's outcome).
fn library_outcome(e: &leasehold::Error) -> Outcome {
    Outcome {
        code: leasehold_cli::exit_code(e),
        stderr: format!("leasehold: {e}\n"),
        stdout: String::new(),
        took: Duration::ZERO,
    }
}

/// User A plants a link (`ln` or `ln -s`, as `ln_args` says) to each victim (root's file, B's
/// file) at each of `names` (relative to a fresh directory of A's, beside `probe.lock`), and
/// root's `run`, `status` and `break` ([`root_scenarios`]) go on there: each works around the
/// link or refuses with 65/77 naming it, never exits 70, and leaves the victim unchanged
/// (bytes, mode, owner, mtime and link count as planted). `case(victim, label)` names a case.
fn link_attacks(
    sc: &Scene,
    kind: &str,
    ln_args: &str,
    names: &[(String, PathBuf)],
    case: impl Fn(&str, &str) -> String,
) {
    let mut n = 0;
    for v in 0..2 {
        for (label, rel) in names {
            n += 1;
            let (vname, victim) = victims(&sc.w, n).swap_remove(v);
            let dir = sc.w.dir(&format!("{kind}-{n}"), 0o755, sc.a());
            let lock = dir.join("probe.lock");
            let planted = dir.join(rel);
            if let Some(parent) = planted.parent().filter(|p| *p != dir) {
                sc.w.sh(sc.a(), 0o022, "mkdir \"$1\"", &[s(parent)]);
            }
            sc.w.sh(
                sc.a(),
                0o022,
                &format!("ln {ln_args} \"$1\" \"$2\""),
                &[s(&victim), s(&planted)],
            );
            let before = Snapshot::of(&victim);
            let case = case(vname, label);
            root_scenarios(sc, &lock, |what, codes, o| {
                judge_planted(sc, &case, what, codes, &planted, o);
                let now = Snapshot::of(&victim);
                sc.check(now == before, || {
                    format!(
                        "{case}: root's {what} changed the victim: before {:?}, after {:?} ({})",
                        before.entries,
                        now.entries,
                        describe(o)
                    )
                });
            });
        }
    }
}

/// Judges one command against a planted file: never 70; a refusal (65 or 77) names the file;
/// otherwise it ended as one of `codes` (it worked around the planted file).
fn judge_planted(sc: &Scene, case: &str, what: &str, codes: &[i32], planted: &Path, o: &Outcome) {
    eprintln!("{case}: root's {what}: {}", first_line(o));
    let ok = match o.code {
        65 | 77 => names_path(&o.stderr, planted),
        c => codes.contains(&c),
    };
    sc.expect(
        ok,
        o,
        format!(
            "{case}: root's {what}: expected {codes:?} (worked around) or 65/77 naming {}",
            planted.display()
        ),
    );
}

/// With `protected_hardlinks=0`, user A hard-links a victim (root's file, B's file) at each
/// helper name beside LOCK in A's directory: root's `run`, `status` and `break` — on a free lock,
/// against a live foreign holder (so root writes its observation file), and contended (so root
/// queues) — leave the victim unchanged (bytes, mode, owner, mtime and link count as planted)
/// and either work around it or refuse with 65/77 naming the file, never exit 70.
#[test]
fn hard_links_at_helper_names_never_touch_the_victim() {
    let test = "hard_links_at_helper_names_never_touch_the_victim";
    if harness::skip(test) {
        return;
    }
    let _p = LinkProtectionsOff::new();
    let sc = Scene::start(test);
    let mut names = relative_helper_names(&sc.w.base, "probe.lock", &[0]);
    names.push(("LOCK itself".into(), PathBuf::from("probe.lock")));
    link_attacks(&sc, "hl", "", &names, |vname, label| {
        format!("{vname} hard-linked at the {label}")
    });
    sc.finish();
}

/// With `protected_symlinks=0`, user A plants a symlink at the queue directory's name pointing
/// at a directory holding ticket-like and other files: root's contended run (which queues) and
/// its `-n` run never list and delete there. Symlinks at the mutex, temp and observation names
/// pointing at victim files leave the victims unchanged whatever root does (free, against a
/// foreign holder, contended); never exit 70.
#[test]
fn symlinks_at_helper_names_and_queue_directory_are_never_followed() {
    let test = "symlinks_at_helper_names_and_queue_directory_are_never_followed";
    if harness::skip(test) {
        return;
    }
    let _p = LinkProtectionsOff::new();
    let sc = Scene::start(test);
    let (w, cs) = (&sc.w, &sc.cs);

    // The queue directory's name is a symlink to a directory of ticket-like files.
    let precious = w.dir("precious", 0o755, Who::Root);
    for (name, body) in [
        ("q-00000000000000000001", "not a ticket\n"),
        ("q-00000000000000000002", "{}\n"),
        ("q-00000000000000000001.lease", "not a lease\n"),
        ("notes.txt", "keep me\n"),
    ] {
        fs::write(precious.join(name), body).unwrap();
    }
    let before = Snapshot::of(&precious);
    let dir = w.dir("sl-queue", 0o755, sc.a());
    let lock = dir.join("job.lock");
    let queue = queue_dir(&lock);
    w.sh(
        sc.a(),
        0o022,
        "ln -s \"$1\" \"$2\"",
        &[s(&precious), s(&queue)],
    );
    let secs30 = Duration::from_secs(30);
    let ttl = ["--ttl", "2s"];
    match sc.hold(
        cs,
        Who::Root,
        0o022,
        &ttl,
        &lock,
        "h",
        Duration::from_secs(20),
    ) {
        Ok(mut holder) => {
            let mut waiter = sc.spawn_as(
                Who::Root,
                0o022,
                &cs.run_args(&["-w", "20", "--ttl", "2s"], &lock, "w", 1),
            );
            let line = wait_line(&waiter, Duration::from_secs(20));
            let o = sc.run_within(Who::Root, 0o022, &run_true(&["-n"], &lock), secs30);
            sc.expect(
                matches!(o.code, 75 | 65 | 77),
                &o,
                "symlinked queue: -n while held",
            );
            cs.release("h");
            let ho = holder.finish(LONG);
            let wo = waiter.finish(LONG);
            sc.expect_ok(&ho, "symlinked queue: holder");
            sc.expect(
                wo.code == 0 && line.is_some()
                    || matches!(wo.code, 65 | 77) && names_path(&wo.stderr, &queue),
                &wo,
                "symlinked queue: contended waiter",
            );
        }
        Err(o) => sc.expect(
            matches!(o.code, 65 | 77) && names_path(&o.stderr, &queue),
            &o,
            "symlinked queue: root's holder could not start",
        ),
    }
    let o = sc.run_within(Who::Root, 0o022, &run_true(&["-n"], &lock), secs30);
    sc.expect(
        o.code == 0 || matches!(o.code, 65 | 77) && names_path(&o.stderr, &queue),
        &o,
        "symlinked queue: -n when free",
    );
    let now = Snapshot::of(&precious);
    sc.check(now == before, || {
        format!(
            "the directory the queue symlink points at changed: before {:?}, after {:?}",
            before.entries, now.entries
        )
    });

    // Symlinks at the file helper names.
    let beside: Vec<_> = relative_helper_names(&w.base, "probe.lock", &[0])
        .into_iter()
        .filter(|(_, rel)| rel.parent() == Some(Path::new("")))
        .collect();
    link_attacks(&sc, "sl", "-s", &beside, |vname, label| {
        format!("symlink at the {label} to {vname}")
    });
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// 5. Forged observation file
// ---------------------------------------------------------------------------------------------

pub(super) fn read_lease(lock: &Path) -> serde_json::Value {
    let bytes = fs::read(lock).unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "LOCK is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

/// The observation files a forger writes: the shared name (older versions) and the per-user
/// files of root and both members, whether or not they exist yet.
fn seen_names(w: &World, lock: &Path) -> Vec<PathBuf> {
    helper_names(lock, &[0, w.a.uid, w.b.uid])
        .into_iter()
        .filter(|(l, _)| l.contains("observation"))
        .map(|(_, p)| p)
        .collect()
}

/// User B writes an observation file claiming this host first saw the current lease (and its
/// next 200 heartbeats) at boot.
fn forge_seen(sc: &Scene, lock: &Path) {
    let lease = read_lease(lock);
    let id = lease["lease_id"].as_str().unwrap().to_string();
    let seq = lease["heartbeat_seq"].as_u64().unwrap();
    let me = leasehold::Identity::current();
    let entries: Vec<serde_json::Value> = (seq..seq + 200)
        .map(|k| {
            serde_json::json!({
                "host": me.host, "boot_id": me.boot_id, "lease_id": id, "key": k,
                "since_boottime_ms": 1
            })
        })
        .collect();
    let body = serde_json::json!({"leasehold_seen": 1, "entries": entries});
    let src = sc.cs.dir.join("forged-seen");
    fs::write(&src, serde_json::to_vec_pretty(&body).unwrap()).unwrap();
    harness::chmod(&src, 0o644);
    for target in seen_names(&sc.w, lock) {
        sc.w.sh(
            sc.b(),
            0o002,
            "cp \"$1\" \"$2.forged\" && mv -f \"$2.forged\" \"$2\"",
            &[s(&src), s(&target)],
        );
    }
}

/// A lock in the group-shared directory `shared`, created by `who`'s `run LOCK -- true` (so the
/// helper files are what the group's own use makes them); a failure to create it is recorded.
fn shared_lock_made_by(sc: &Scene, who: Who) -> PathBuf {
    let lock = sc.lock_in("shared", 0o2775);
    let o = sc.run_as(who, 0o002, &run_true(&[], &lock));
    sc.expect_ok(&o, format!("{} creating the lock", who.name()));
    lock
}

/// A forged observation file (written by group member B, claiming this host has seen the current
/// heartbeat since boot) does not get member A's healthy same-host holder judged hung: root's
/// and B's contenders (`-n`, `-w 2`, `break`) are refused, A's job keeps running and A keeps its
/// lease.
#[test]
fn forged_observation_file_does_not_get_a_healthy_holder_killed() {
    let test = "forged_observation_file_does_not_get_a_healthy_holder_killed";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let cs = &sc.cs;
    let lock = sc.lock_in("shared", 0o2775);
    let mut holder = sc.spawn_as(sc.a(), 0o002, &cs.hold_args(&["--ttl", "1s"], &lock, "a"));
    cs.wait_entered("a", Duration::from_secs(20));
    let job = cs.job_pid("a").unwrap();
    let lease_id = read_lease(&lock)["lease_id"].clone();
    for (who, a) in [
        (Who::Root, run_true(&["-n"], &lock)),
        (sc.b(), run_true(&["-n"], &lock)),
        (Who::Root, run_true(&["-w", "2"], &lock)),
        (sc.b(), run_true(&["-w", "2"], &lock)),
        (Who::Root, vec!["break", s(&lock)]),
    ] {
        forge_seen(&sc, &lock);
        let o = sc.run_within(who, 0o002, &a, Duration::from_secs(30));
        sc.expect(
            o.code == 75,
            &o,
            format!("{} {a:?} with a forged observation", who.name()),
        );
        sc.check(
            !harness::is_dead(job) && holder.child.try_wait().unwrap().is_none(),
            || format!("{} {a:?}: A's holder or job was killed", who.name()),
        );
    }
    let st = sc.run_as(Who::Root, 0o022, &["status", "--json", s(&lock)]);
    sc.check(st.stdout.contains("\"held\""), || {
        format!("status with a forged observation: {}", st.stdout)
    });
    sc.check(read_lease(&lock)["lease_id"] == lease_id, || {
        "A's lease was replaced".into()
    });
    cs.release("a");
    let o = holder.finish(LONG);
    sc.expect_ok(&o, "A's holder");
    sc.finish();
}

/// A live holder on another host (played by the library with a foreign identity, renewing
/// normally) is not broken by contenders of this host reading a forged observation file that
/// claims they saw its heartbeat stand still since boot: over 1.5 of its TTLs every `-n` of root
/// and of member A is refused, a `-w` runs out, `break` refuses, and the holder never loses its
/// lease. (B's own contenders are not asked: B forging B's own observations only fools B, who
/// could as well `break --force`.)
#[test]
fn forged_observation_file_does_not_break_a_live_foreign_holder() {
    let test = "forged_observation_file_does_not_break_a_live_foreign_holder";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let lock = shared_lock_made_by(&sc, sc.b());
    let ttl = Duration::from_secs(2);
    let guard = leasehold::LeaseBuilder::new(&lock)
        .ttl(ttl)
        .identity(foreign_identity())
        .try_acquire()
        .expect("the foreign holder takes the free lock");
    let lease_id = read_lease(&lock)["lease_id"].clone();
    let start = Instant::now();
    let mut attempts = 0;
    let mut broken = false;
    while !broken && start.elapsed() < ttl * 3 / 2 {
        for who in [Who::Root, sc.a()] {
            forge_seen(&sc, &lock);
            let o = sc.run_within(
                who,
                0o002,
                &run_true(&["-n"], &lock),
                Duration::from_secs(30),
            );
            attempts += 1;
            let at = start.elapsed();
            if o.code == 0 {
                let what = format!(
                    "{}'s -n at {at:?} broke the live foreign holder",
                    who.name()
                );
                sc.expect(false, &o, what);
                broken = true;
                break;
            }
            let what = format!(
                "{}'s -n at {at:?} against a live foreign holder",
                who.name()
            );
            sc.expect(o.code == 75, &o, what);
        }
    }
    forge_seen(&sc, &lock);
    let o = sc.run_as(Who::Root, 0o002, &run_true(&["-w", "3"], &lock));
    sc.expect(o.code == 75, &o, "root's -w 3");
    forge_seen(&sc, &lock);
    let o = sc.run_as(Who::Root, 0o002, &["break", s(&lock)]);
    sc.expect(o.code == 75, &o, "root's break");
    sc.check(!guard.is_lost(), || {
        "the foreign holder lost its lease".into()
    });
    sc.check(read_lease(&lock)["lease_id"] == lease_id, || {
        "the foreign holder's lease was replaced".into()
    });
    eprintln!(
        "{test}: {attempts} one-shot attempts over {:?}",
        start.elapsed()
    );
    drop(guard);
    sc.finish();
}

/// A silent holder on another host (a lease whose heartbeat never moves) with a forged
/// observation file claiming this host has seen it stand still since boot: root's one-shot
/// `run -n` calls are refused until root itself has watched it for a full TTL, and then one of
/// them takes it over (within the TTL plus 3 s) — the forgery neither shortens the TTL nor, by
/// squatting root's observation file, keeps the dead lease from ever going stale.
#[test]
fn forged_observation_file_does_not_shorten_a_dead_foreign_holders_ttl() {
    let test = "forged_observation_file_does_not_shorten_a_dead_foreign_holders_ttl";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let lock = shared_lock_made_by(&sc, sc.b());
    let mut far = foreign_identity();
    far.pid_ns = 1;
    far.uid = 0;
    far.user = "root".into();
    let ttl = Duration::from_millis(1500);
    let mut lease = crate::support::crafted(4242, 1, &far, ttl, 5);
    lease.lease_id = "0123456789abcdef0123456789abcdef".into();
    lease.holder.command = vec!["far away".into()];
    lease.holder.note = None;
    crate::support::write_atomic(&lock, &lease.to_bytes());
    forge_seen(&sc, &lock);
    let start = Instant::now();
    let mut tries = Vec::new();
    let taken = loop {
        let o = sc.run_within(
            Who::Root,
            0o022,
            &run_true(&["-n"], &lock),
            Duration::from_secs(30),
        );
        let at = start.elapsed();
        tries.push((at, o.code));
        if o.code != 75 || at > ttl + Duration::from_secs(3) {
            break (at, o);
        }
        // Pacing of a one-shot caller (cron-like), not synchronisation.
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "{test}: {} one-shot tries; first {:?}, last {:?}",
        tries.len(),
        tries.first(),
        tries.last()
    );
    match taken {
        (at, o) if o.code == 0 => {
            eprintln!("{test}: taken over after {at:?}: {}", first_line(&o));
            sc.check(at >= ttl, || {
                format!(
                    "the dead foreign lease was taken over after {at:?}, before its TTL {ttl:?}"
                )
            });
        }
        (at, o) => sc.expect(
            false,
            &o,
            format!(
                "the dead foreign lease was not taken over by root's one-shot calls within its \
                 TTL {ttl:?} + 3 s (last after {at:?})"
            ),
        ),
    }
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// 6 and 7. The mutex or a ticket held by another user's process
// ---------------------------------------------------------------------------------------------

/// While user B's process holds the flock of the mutex file (`flock MUTEX sleep`), user A's
/// `run` prints a wait line within about a second naming B's process and user, and `run -w 1`
/// exits 75 after about a second naming them.
#[test]
fn mutex_held_by_another_users_process_is_named_and_w_is_kept() {
    let test = "mutex_held_by_another_users_process_is_named_and_w_is_kept";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let lock = sc.lock_in("shared", 0o2775);
    let o = sc.run_as(sc.a(), 0o002, &run_true(&[], &lock));
    assert_eq!(o.code, 0, "A creates the lock: {}", describe(&o));
    let mutex = helper_names(&lock, &[])[0].1.clone();
    let mut sq = sc.flock_as(
        sc.b(),
        &mutex,
        "touch \"$0\"; exec sleep 120",
        &[],
        "B's flock on the mutex",
    );
    let pid = sq.pid().to_string();
    let names = |l: &str| l.contains(&pid) && l.contains(&sc.w.b.name);

    let mut waiter = sc.spawn_as(sc.a(), 0o002, &run_true(&[], &lock));
    let line = waiter.wait_line(Duration::from_secs(5), names);
    eprintln!("{test}: A's wait line: {line:?}");
    sc.check(
        line.as_ref()
            .is_some_and(|(_, t)| *t < Duration::from_millis(2500)),
        || {
            format!(
                "A's run printed no line naming B's pid {pid} and user {} within about a second: \
             {line:?}, stderr: {:?}",
                sc.w.b.name,
                waiter.stderr_so_far()
            )
        },
    );
    sc.check(waiter.child.try_wait().unwrap().is_none(), || {
        format!(
            "A's run (no -w) did not keep waiting: {:?}",
            waiter.stderr_so_far()
        )
    });
    waiter.kill();

    let o = sc.run_within(
        sc.a(),
        0o002,
        &run_true(&["-w", "1"], &lock),
        Duration::from_secs(20),
    );
    sc.expect(
        o.code == 75
            && o.took >= Duration::from_millis(900)
            && o.took < Duration::from_secs(4)
            && names(&o.stderr),
        &o,
        format!("A's run -w 1 against B's mutex holder (pid {pid})"),
    );
    sq.kill();
    sc.finish();
}

/// User B plants a ticket in the queue directory and keeps it alive (holds its flock and
/// rewrites its beat): user A's waiter names that pid and user in its wait line and gives up at
/// its `-w` with 75, its command not run; A's `-n` is refused.
#[test]
fn beating_ticket_of_another_user_is_named_and_w_is_kept() {
    let test = "beating_ticket_of_another_user_is_named_and_w_is_kept";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let cs = &sc.cs;
    let lock = sc.lock_in("shared", 0o2775);
    // Let leasehold make its queue directory: A holds, A waits.
    let mut h = sc.spawn_as(sc.a(), 0o002, &cs.hold_args(&[], &lock, "h"));
    cs.wait_entered("h", Duration::from_secs(20));
    let mut q = sc.spawn_as(sc.a(), 0o002, &cs.run_args(&["-w", "20"], &lock, "q", 1));
    let line = wait_line(&q, Duration::from_secs(20));
    assert!(
        line.is_some(),
        "A's second run did not wait: {}",
        q.stderr_so_far()
    );
    cs.release("h");
    assert_eq!(h.finish(LONG).code, 0);
    assert_eq!(q.finish(LONG).code, 0);
    let queue = queue_dir(&lock);
    let ticket = queue.join("q-00000000000000000001");
    let host = leasehold::Identity::current().host;
    let script = r#"ready=$0 f=$1 host=$2 user=$3
n=0
while :; do
  n=$((n+1))
  printf '{"seq":1,"pid":%d,"host":"%s","user":"%s","since":"2026-01-01T00:00:00.000000Z","command":["planted"],"beat":%20d}\n' "$PPID" "$host" "$user" "$n" 1<>"$f"
  [ -e "$ready" ] || touch "$ready"
  sleep 0.1
done"#;
    let what = format!(
        "B's beating ticket in {} (mode {:o})",
        queue.display(),
        fs::metadata(&queue).map(|m| m.mode()).unwrap_or(0)
    );
    let mut b = sc.flock_as(
        sc.b(),
        &ticket,
        script,
        &[s(&ticket), &host, &sc.w.b.name],
        &what,
    );
    let pid = b.pid().to_string();
    let names = |l: &str| l.contains(&pid) && l.contains(&sc.w.b.name);
    let marker = cs.dir.join("a-ran");
    let w3 = ["run", "-w", "3", s(&lock), "--", "touch", s(&marker)];
    let mut a = sc.spawn_as(sc.a(), 0o002, &w3);
    let line = a.wait_line(Duration::from_secs(5), names);
    eprintln!("{test}: A's wait line: {line:?}");
    let o = a.finish(Duration::from_secs(20));
    sc.expect(
        line.is_some(),
        &o,
        format!(
            "A's waiter did not name B's ticket (pid {pid}, user {})",
            sc.w.b.name
        ),
    );
    sc.expect(
        o.code == 75
            && o.took >= Duration::from_millis(2500)
            && o.took < Duration::from_secs(8)
            && !marker.exists(),
        &o,
        "A's -w 3 behind B's live ticket",
    );
    let n = ["run", "-n", s(&lock), "--", "touch", s(&marker)];
    let o = sc.run_within(sc.a(), 0o002, &n, Duration::from_secs(20));
    sc.expect(
        o.code == 75 && !marker.exists(),
        &o,
        "A's -n with B's live ticket queued",
    );
    sc.check(b.child.try_wait().unwrap().is_none(), || {
        "B's ticket holder died".into()
    });
    b.kill();
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// 8. Squatted helper names
// ---------------------------------------------------------------------------------------------

/// A directory, a FIFO or a UNIX socket of user B at a helper name: user A's runs — on a free
/// lock, against a live foreign holder (A observes it), and queued behind user C — are refused
/// with 65 or 77 naming the path and its owner (or, where a run can do without that name, end as
/// they would have), never exit 70, never hang; the squatter is unchanged. At the mutex name a
/// refusal is required.
#[test]
fn squatted_helper_names_are_refused_clearly() {
    let test = "squatted_helper_names_are_refused_clearly";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let (w, cs) = (&sc.w, &sc.cs);
    let mut n = 0;
    let mut names = relative_helper_names(&w.base, "job.lock", &[w.a.uid]);
    let qrel = queue_dir(&w.base.join("job.lock"))
        .strip_prefix(&w.base)
        .unwrap()
        .to_path_buf();
    names.push(("queue directory".into(), qrel));
    for (label, rel) in names {
        for kind in ["directory", "FIFO", "socket"] {
            if label == "queue directory" && kind == "directory" {
                continue;
            }
            n += 1;
            let lock = sc.lock_in(&format!("sq-{n}"), 0o2775);
            let dir = lock.parent().unwrap();
            let squat = dir.join(&rel);
            if let Some(parent) = squat.parent().filter(|p| *p != dir) {
                w.sh(sc.b(), 0o002, "mkdir \"$1\"", &[s(parent)]);
            }
            match kind {
                "directory" => w.sh(sc.b(), 0o002, "mkdir \"$1\"", &[s(&squat)]),
                "FIFO" => w.sh(sc.b(), 0o002, "mkfifo \"$1\"", &[s(&squat)]),
                _ => {
                    let l = std::os::unix::net::UnixListener::bind(&squat).unwrap();
                    std::mem::forget(l);
                    std::os::unix::fs::lchown(&squat, Some(w.b.uid), Some(w.gid)).unwrap();
                }
            }
            let before = Snapshot::of(&squat);
            let case = format!("{kind} of B at the {label}");
            // Refused with the path and its owner — or, where the run could do without the
            // name, it ended as it would have anyway (`codes`), never 70.
            let judge = |what: &str, codes: &[i32], o: &Outcome, ran: bool| {
                eprintln!("{case}: A's {what}: {}", first_line(o));
                let refused = matches!(o.code, 65 | 77)
                    && names_path(&o.stderr, &squat)
                    && (o.stderr.contains(&w.b.name) || o.stderr.contains(&w.b.uid.to_string()));
                let worked = codes.contains(&o.code) && ran && label != "mutex";
                let instead = if label == "mutex" {
                    String::new()
                } else {
                    format!(" (or {codes:?}, working around it)")
                };
                sc.expect(
                    refused || worked,
                    o,
                    format!(
                        "{case}: A's {what}: expected 65/77 naming {} and {}{instead}",
                        squat.display(),
                        w.b.name,
                    ),
                );
            };
            let limit = Duration::from_secs(30);
            // Free.
            let id = format!("j{n}");
            let o = sc.run_within(sc.a(), 0o002, &cs.run_args(&["-n"], &lock, &id, 1), limit);
            judge("run -n, free", &[0], &o, cs.ended(&id));
            // A live holder on another host: A observes it (its observation file).
            match leasehold::LeaseBuilder::new(&lock)
                .ttl(Duration::from_secs(2))
                .identity(foreign_identity())
                .try_acquire()
            {
                Ok(guard) => {
                    let o = sc.run_within(sc.a(), 0o002, &run_true(&["-n"], &lock), limit);
                    judge("run -n, foreign holder", &[75], &o, true);
                    drop(guard);
                }
                // Refused as a run would be: 65/77 naming the squatter and B.
                Err(e) => judge(
                    "foreign holder (the library)",
                    &[],
                    &library_outcome(&e),
                    false,
                ),
            }
            // Contended: C holds, A queues behind (a ticket, a prepared lease).
            let hid = format!("h{n}");
            match sc.hold(cs, sc.c(), 0o002, &["--ttl", "2s"], &lock, &hid, limit) {
                Ok(mut holder) => {
                    let wid = format!("w{n}");
                    let pre = ["-w", "10", "--ttl", "2s"];
                    let mut waiter = sc.spawn_as(sc.a(), 0o002, &cs.run_args(&pre, &lock, &wid, 1));
                    let waited = wait_line(&waiter, limit).is_some();
                    cs.release(&hid);
                    let ho = holder.finish(LONG);
                    sc.expect_ok(&ho, format!("{case}: C's holder"));
                    let o = waiter.finish(LONG);
                    judge("run -w 10, contended", &[0], &o, cs.ended(&wid));
                    sc.check(waited || o.code != 0, || {
                        format!(
                            "{case}: A's waiter neither waited nor was refused: {}",
                            describe(&o)
                        )
                    });
                }
                // C's holder is refused only as A's runs are: 65/77 naming the squatter and B.
                Err(o) => judge("holder run of C", &[], &o, false),
            }
            let now = Snapshot::of(&squat);
            sc.check(now == before, || {
                format!(
                    "{case}: the squatter changed: {:?} -> {:?}",
                    before.entries, now.entries
                )
            });
        }
    }
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// 9. Another user's remnant
// ---------------------------------------------------------------------------------------------

/// User A's job leaves a process in its process group when A's holder is SIGKILLed. User B's
/// takeover does not run its job beside it: B is refused (75) with a message naming the process
/// it cannot check or stop and what to do, and a waiting B says so and gives up at its `-w`.
/// Root's takeover, the remnant still alive, kills it (verified dead before root's job starts)
/// and runs; B then takes the lock as usual.
#[test]
fn other_users_remnant_is_never_left_running_beside_a_new_job() {
    let test = "other_users_remnant_is_never_left_running_beside_a_new_job";
    let Some(sc) = Scene::new(test) else {
        return;
    };
    let cs = &sc.cs;
    let lock = sc.lock_in("shared", 0o2775);
    let rfile = cs.dir.join("remnant");
    let entered = cs.dir.join("a-entered");
    let mut holder = sc.spawn_as(
        sc.a(),
        0o002,
        &[
            "run",
            "--ttl",
            "2s",
            s(&lock),
            "--",
            "sh",
            "-c",
            "sleep 300 & echo $! > \"$0\"; touch \"$1\"; wait",
            s(&rfile),
            s(&entered),
        ],
    );
    assert!(
        harness::wait_until(Duration::from_secs(20), || entered.exists()),
        "A's job did not start: {}",
        holder.stderr_so_far()
    );
    let remnant: i32 = fs::read_to_string(&rfile).unwrap().trim().parse().unwrap();
    let rstart = harness::start_time(remnant);
    // Its guardian goes first (as under the OOM killer), or it would stop the remnant itself.
    crate::support::kill_guardian(holder.pid());
    holder.signal(Signal::SIGKILL);
    assert_eq!(holder.finish(LONG).code, 137);
    assert!(
        !harness::is_dead(remnant),
        "the remnant must outlive A's holder for this test"
    );

    // The job records whether the remnant was alive when it started.
    let job = "if [ -r /proc/$1/stat ] && ! grep -q '^[0-9]* ([^)]*) [ZX]' /proc/$1/stat; \
               then echo alive; else echo dead; fi > \"$0\"";
    let r = remnant.to_string();
    // `leasehold run PRE LOCK -- sh -c JOB SAW REMNANT`, and the file its job writes.
    let run_job = |pre: &[&'static str], saw: &str| {
        let saw = cs.dir.join(saw);
        let mut a: Vec<String> = vec!["run".into()];
        a.extend(pre.iter().map(|p| p.to_string()));
        a.extend([s(&lock), "--", "sh", "-c", job, s(&saw), &r].map(String::from));
        (a, saw)
    };
    for (pre, label) in [(vec!["-n"], "-n"), (vec!["-w", "2"], "-w 2")] {
        let (a, saw) = run_job(&pre, &format!("b-saw{}", label.replace(' ', "")));
        let o = sc.run_within(sc.b(), 0o002, &a, Duration::from_secs(30));
        eprintln!("{test}: B's {label}: {}", first_line(&o));
        let said = fs::read_to_string(&saw).unwrap_or_default();
        let msg = o.stderr.to_lowercase();
        // Names the process, says it cannot be checked (or stopped), and what to do.
        let explains = o.stderr.contains(&r)
            && ["cannot", "can't", "not permitted"]
                .iter()
                .any(|k| msg.contains(k))
            && ["as root", "kill", "break", "stop"]
                .iter()
                .any(|k| msg.contains(k));
        sc.expect(
            o.code == 75 && said.is_empty() && explains || o.code == 0 && said.trim() == "dead",
            &o,
            format!(
                "B's {label} takeover beside A's remnant (pid {r}): job saw {:?}; expected 75 \
                 naming the process and what to do",
                said.trim()
            ),
        );
    }
    sc.check(
        harness::start_time(remnant) == rstart && !harness::is_dead(remnant),
        || "B (without permission) cannot have killed the remnant; it is gone unexpectedly".into(),
    );
    // A blocking B waits, saying why, while the remnant lives, and gives up at its -w.
    let (a, saw) = run_job(&["-w", "3"], "b-saw-waited");
    let mut waiter = sc.spawn_as(sc.b(), 0o002, &a);
    let line = waiter.wait_line(Duration::from_secs(10), |l| l.contains("cannot be checked"));
    let o = waiter.finish(Duration::from_secs(30));
    sc.check(line.is_some() && !saw.exists() && o.code == 75, || {
        format!(
            "B's -w 3 should wait, naming the remnant it cannot check, then give up (75): {}",
            describe(&o)
        )
    });
    // Root's takeover, with the remnant still alive (nobody else stopped it), stops it —
    // root can verify it — and only then runs its job.
    sc.check(
        !harness::is_dead(remnant) && harness::start_time(remnant) == rstart,
        || "the remnant must still run when root takes over".into(),
    );
    let (a, saw) = run_job(&["-n"], "root-saw");
    let o = sc.run_within(Who::Root, 0o022, &a, Duration::from_secs(30));
    let said = fs::read_to_string(&saw).unwrap_or_default();
    sc.expect(
        o.code == 0 && said.trim() == "dead",
        &o,
        format!(
            "root's takeover: the remnant was {:?} when root's job started",
            said.trim()
        ),
    );
    sc.check(harness::is_dead(remnant), || {
        "root's takeover left the remnant running".into()
    });
    // And B, after root, takes the lock as usual.
    let (a, saw) = run_job(&["-n"], "b-saw-after");
    let o = sc.run_within(sc.b(), 0o002, &a, Duration::from_secs(30));
    let said = fs::read_to_string(&saw).unwrap_or_default();
    sc.expect(
        o.code == 0 && said.trim() == "dead",
        &o,
        "B's run after root's",
    );
    sc.finish();
}

// ---------------------------------------------------------------------------------------------
// The checker itself
// ---------------------------------------------------------------------------------------------

/// The critical-section checker fails when two jobs are inside at once — whether the first is an
/// ordinary job or one declared killed whose shell is still alive — so the suite's "no overlap"
/// can fail. Runs the jobs directly, without leasehold (needs no root).
#[test]
fn critical_section_checker_reports_two_jobs_inside_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    for declare_killed in [false, true] {
        let cs = Cs::new(tmp.path(), &format!("cs-{declare_killed}"));
        let start = |a: Vec<String>| {
            std::process::Command::new(&a[0])
                .args(&a[1..])
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let first = cs.hold_args(&[], Path::new("unused"), "first");
        let mut x = start(first[first.iter().position(|a| a == "--").unwrap() + 1..].to_vec());
        cs.wait_entered("first", Duration::from_secs(20));
        if declare_killed {
            cs.declare_killed("first");
        }
        let mut y = start(cs.job("second", 1, "0.01"));
        assert!(y.wait().unwrap().success());
        cs.release("first");
        assert!(x.wait().unwrap().success());
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cs.verify()));
        assert!(
            caught.is_err(),
            "the checker missed two jobs inside at once (first declared killed: {declare_killed})"
        );
    }
}
