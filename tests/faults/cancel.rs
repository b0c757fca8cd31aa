//! A cancelled job: the `leasehold run` wrapper SIGKILLed with its caller's whole process group
//! (what a CI runner's cancel does: `kill -KILL -- -PGID`), or alone. Its guardian must stop
//! every process of the command's tree within the grace — processes in the command's group,
//! one that ignores SIGTERM, one that left the group with `setsid` but carries the lease's
//! environment —, and a same-host contender (`run -n`, `run -w`) must not start its command
//! before they are gone (the shared checker, `support::cs`, with the old job's section held by
//! the process that left the group). A command that ends by itself dismisses its guardian, which
//! signals nothing: what the command deliberately left running outside its group keeps running.

use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::support::{self, Cs, Proc};

/// The grace the jobs run with (`--grace`), and what the tests allow beyond it.
const GRACE: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_secs(1);

/// A lock directory and a checker on tmpfs.
struct Scene {
    _base: tempfile::TempDir,
    lock: PathBuf,
    work: PathBuf,
    cs: Cs,
}

impl Scene {
    fn new() -> Scene {
        let base = support::tempdir();
        let work = base.path().join("work");
        fs::create_dir_all(base.path().join("locks")).unwrap();
        fs::create_dir_all(&work).unwrap();
        let cs = Cs::new(&work, "cs");
        Scene {
            lock: base.path().join("locks/job.lock"),
            work,
            cs,
            _base: base,
        }
    }

    fn pids_file(&self) -> PathBuf {
        self.work.join("pids")
    }

    /// The old job's script: the checker's section `old` held by a process in the command's
    /// group (`escaped` false) or by one that left it with `setsid` and ignores SIGTERM (true),
    /// a process in the group that ignores SIGTERM, and a `setsid` sleeper; every pid written
    /// to the pids file.
    fn old_job(&self, escaped: bool) -> String {
        // Creates the section's FIFO; the command line is built here.
        let _ = self.cs.hold_args(&[], &self.lock, "old");
        let job = self.cs.job("old", 0, "0").join(" ");
        let p = self.pids_file();
        let p = p.display();
        let section = if escaped {
            // It ignores SIGTERM: alive for the whole grace, as a job that cleans up slowly.
            format!("setsid sh -c 'trap \"\" TERM; echo $$ >> {p}; exec {job}' &")
        } else {
            format!("{job} & echo $! >> {p}")
        };
        format!(
            "echo $$ >> {p}; {section}
             sh -c 'trap \"\" TERM; echo $$ >> {p}; exec sleep 300' &
             setsid sh -c 'echo $$ >> {p}; exec sleep 301' &
             wait"
        )
    }

    /// The old job's processes with their start times, once all four have written their pid
    /// and the section is entered.
    fn tree(&self) -> Vec<(i32, u64)> {
        let mut out = Vec::new();
        support::ensure_within("the old job to start", Duration::from_secs(10), || {
            let Ok(text) = fs::read_to_string(self.pids_file()) else {
                return false;
            };
            out = text
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .filter_map(|p| support::start_time(p).map(|s| (p, s)))
                .collect();
            out.len() == 4 && self.cs.entered("old")
        });
        out
    }
}

/// `sh -c '"$0" run --grace 1s LOCK -c SCRIPT; echo after'` in a process group of its own: a CI
/// job's shell, with leasehold (and not `exec`) in it.
fn caller(s: &Scene, script: &str) -> Proc {
    caller_of(
        s,
        "\"$0\" run --grace 1s \"$1\" -c \"$2\"; echo after",
        script,
    )
}

/// The same shell around the flock(1) drop-in: `"$0" flock LOCK -c SCRIPT`, with a TTL of 4 s
/// (so a grace of 1 s).
fn flock_caller(s: &Scene, script: &str) -> Proc {
    let line =
        "LEASEHOLD_FLOCK_FENCE=1 LEASEHOLD_FLOCK_TTL=4s \"$0\" flock \"$1\" -c \"$2\"; echo after";
    caller_of(s, line, script)
}

fn caller_of(s: &Scene, line: &str, script: &str) -> Proc {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(line)
        .arg(support::bin())
        .arg(&s.lock)
        .arg(script)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: default_signals only calls signal(2), which is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            support::default_signals();
            Ok(())
        });
    }
    Proc::spawn(c, "caller")
}

/// Asserts that every process of `tree` is dead (gone or a zombie) within the grace and the
/// slack after `t0`; names the survivors otherwise.
#[track_caller]
fn tree_gone(tree: &[(i32, u64)], t0: Instant) {
    let limit = (GRACE + SLACK).saturating_sub(t0.elapsed());
    let gone = support::wait_until(limit, || {
        tree.iter().all(|&(p, st)| !support::proc_alive(p, st))
    });
    let left: Vec<_> = tree
        .iter()
        .filter(|&&(p, st)| support::proc_alive(p, st))
        .collect();
    for &&(p, _) in &left {
        let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    assert!(
        gone,
        "processes of the command's tree still alive {:?} after the cancel (grace {GRACE:?}): {left:?}",
        t0.elapsed()
    );
}

/// Once the command of `s`'s lock runs: its wrapper's pid and its guardian's (the wrapper's
/// child named `lh-guardian`, which is not the command).
#[track_caller]
fn running_with_guardian(s: &Scene) -> (i32, i32) {
    let (wrapper, child, _) = support::wait_for_child(&s.lock);
    let mut guardian = None;
    support::ensure_within("the guardian to be seen", Duration::from_secs(5), || {
        guardian = support::guardian_of(wrapper).filter(|&g| g != child);
        guardian.is_some()
    });
    (wrapper, guardian.unwrap())
}

/// The system call `pid` is blocked in (`/proc/PID/syscall`), once it is blocked in one.
#[track_caller]
fn blocked_in(pid: i32) -> i64 {
    let mut n = None;
    support::ensure_within("the guardian to wait", Duration::from_secs(5), || {
        n = fs::read_to_string(format!("/proc/{pid}/syscall"))
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        n.is_some()
    });
    n.unwrap()
}

/// SIGKILLs the group of `sh` (a caller whose job's tree has started), then checks that every
/// process of the tree is gone within grace + 1 s and the guardian said so on the caller's
/// stderr.
fn group_kill_stops_the_tree(s: &Scene, mut sh: Proc) {
    let tree = s.tree();
    let t0 = Instant::now();
    killpg(Pid::from_raw(sh.pid()), Signal::SIGKILL).unwrap();
    sh.wait_timeout(Duration::from_secs(5));
    tree_gone(&tree, t0);
    let said = sh.wait_line(Duration::from_secs(5), |l| {
        l.contains("its guardian stopped")
    });
    assert!(
        said.is_some(),
        "no guardian line on the caller's stderr:\n{}",
        sh.stderr_so_far()
    );
}

/// The caller's group SIGKILLed: every process of the tree is gone within grace + 1 s.
#[test]
fn group_kill_of_the_caller_stops_the_whole_tree_within_the_grace() {
    let s = Scene::new();
    let sh = caller(&s, &s.old_job(false));
    group_kill_stops_the_tree(&s, sh);
}

/// The flock(1) drop-in's wrapper, SIGKILLed with its caller's group: the same (the drop-in's
/// wrapper has its keeper's threads when it starts the command and its guardian).
#[test]
fn group_kill_of_a_drop_in_caller_stops_the_whole_tree_within_the_grace() {
    let s = Scene::new();
    let sh = flock_caller(&s, &s.old_job(true));
    group_kill_stops_the_tree(&s, sh);
}

/// The same where the guardian cannot wait dormant (`clone(CLONE_VM)`): under valgrind, which
/// leasehold knows by the `vgpreload_*.so` it preloads, the guardian is forked as on other
/// architectures. A library of this process's own (libc) stands in for valgrind's preload.
#[test]
fn group_kill_of_a_caller_under_valgrinds_preload_stops_the_whole_tree_within_the_grace() {
    let s = Scene::new();
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .split_whitespace()
        .find(|w| w.starts_with('/') && w.contains("/libc.so"))
        .expect("this test's libc in /proc/self/maps");
    let preload = s.work.join("vgpreload_stand-in.so");
    std::os::unix::fs::symlink(libc, &preload).unwrap();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("\"$0\" run --grace 1s \"$1\" -c \"$2\"; echo after")
        .arg(support::bin())
        .arg(&s.lock)
        .arg(s.old_job(false))
        .env("LD_PRELOAD", &preload)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let sh = Proc::spawn(c, "caller");
    // Forked, it is named only once it serves (the dormant child names itself once set up).
    let (_, g) = running_with_guardian(&s);
    // Forked, it reads its socket (armed, it waits for EOF); dormant, it would wait in ppoll.
    assert_eq!(blocked_in(g), nix::libc::SYS_read);
    group_kill_stops_the_tree(&s, sh);
}

/// The wrapper alone SIGKILLed (its caller lives on): the same.
#[test]
fn wrapper_killed_alone_stops_the_whole_tree_within_the_grace() {
    let s = Scene::new();
    let mut sh = caller(&s, &s.old_job(true));
    let tree = s.tree();
    let (wrapper, _, _) = support::wait_for_child(&s.lock);
    let t0 = Instant::now();
    nix::sys::signal::kill(Pid::from_raw(wrapper), Signal::SIGKILL).unwrap();
    tree_gone(&tree, t0);
    // The caller's shell goes on with its next step, as after any failed command.
    let st = sh.wait_timeout(Duration::from_secs(5));
    assert_eq!(support::code(st), 0);
}

/// Same-host contenders started right after the cancel, at once (`-n`) and waiting (`-w`), never
/// run their command while a process of the old job lives — the old job's section is held by
/// a process that left the command's group.
#[test]
fn a_contender_does_not_start_beside_a_cancelled_job() {
    for flags in [["-n", "--grace=1s"], ["-w", "10s"]] {
        let s = Scene::new();
        let mut sh = caller(&s, &s.old_job(true));
        let tree = s.tree();
        s.cs.declare_killed("old");
        let t0 = Instant::now();
        killpg(Pid::from_raw(sh.pid()), Signal::SIGKILL).unwrap();
        let new = s.cs.run_args(&flags, &s.lock, "new", 1);
        let mut c = Proc::spawn(
            support::lh()
                .args(&new)
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            "contender",
        );
        let code = support::code(c.wait_timeout(Duration::from_secs(20)));
        sh.wait_timeout(Duration::from_secs(5));
        tree_gone(&tree, t0);
        let ok = if flags[0] == "-n" { [0, 75] } else { [0, 0] };
        assert!(
            ok.contains(&code),
            "{flags:?}: contender exited {code}: {}",
            c.stderr()
        );
        let v = s.cs.violations();
        assert!(v.is_empty(), "{flags:?}: overlaps:\n{}", v.join("\n"));
        let overlaps = support::cs::overlaps(&s.cs.intervals());
        assert!(overlaps.is_empty(), "{flags:?}: {}", overlaps.join("\n"));
    }
}

/// A command that ends by itself: its guardian goes without signalling anything and leaves no
/// process behind; a daemon the command deliberately left outside its group (with `setsid`)
/// keeps running, as it always did (leftovers in the group are stopped before the release, as
/// before).
#[test]
fn a_clean_end_dismisses_the_guardian_and_keeps_what_was_left_outside_the_group() {
    let s = Scene::new();
    let daemon = s.work.join("daemon");
    let release = s.work.join("release");
    let script = format!(
        "setsid sh -c 'echo $$ > {d}; exec sleep 300' &
         while [ ! -e {r} ]; do sleep 0.02; done",
        d = daemon.display(),
        r = release.display()
    );
    let mut w = Proc::spawn(
        support::lh()
            .args(["run", "--grace", "1s"])
            .arg(&s.lock)
            .arg("-c")
            .arg(&script)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "wrapper",
    );
    let (_, guardian) = running_with_guardian(&s);
    support::ensure_within("the daemon to start", Duration::from_secs(5), || {
        fs::read_to_string(&daemon).is_ok_and(|t| t.ends_with('\n'))
    });
    let d: i32 = fs::read_to_string(&daemon).unwrap().trim().parse().unwrap();
    let d_start = support::start_time(d).unwrap();
    fs::write(&release, "").unwrap();
    let st = w.wait_timeout(Duration::from_secs(10));
    assert_eq!(support::code(st), 0, "{}", w.stderr());
    let t0 = Instant::now();
    assert!(
        support::wait_until(SLACK, || support::is_dead(guardian)),
        "the guardian (pid {guardian}) still alive after the wrapper's clean exit"
    );
    // Nothing may signal the daemon: it still runs after the grace and the slack.
    let died = support::wait_until(GRACE + SLACK, || !support::proc_alive(d, d_start));
    let _ = nix::sys::signal::kill(Pid::from_raw(d), Signal::SIGKILL);
    assert!(
        !died,
        "the daemon left outside the group died {:?} after a clean exit",
        t0.elapsed()
    );
    let err = w.stderr();
    assert!(!err.contains("guardian"), "{err}");
}

/// How long a guardian stays dormant at most (`src/supervise/guardian/dormant.rs`), and how
/// much of it a test may take to look at a dormant one.
const DORMANT_FOR: Duration = Duration::from_secs(1);
const DORMANT_LOOK: Duration = Duration::from_millis(800);

/// `pid`'s descriptors and what they link to.
fn fd_links(pid: i32) -> std::collections::BTreeMap<i32, String> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_str()?.parse().ok()?;
            Some((n, fs::read_link(e.path()).ok()?.display().to_string()))
        })
        .collect()
}

/// Waits until the guardian `g` has exec'd itself after its dormant second (it runs
/// `leasehold --leasehold-guardian`) and taken the descriptors the arming sent.
#[track_caller]
fn wait_for_exec_past_the_dormant_second(g: i32) {
    support::ensure_within(
        "the guardian to exec itself after its dormant second",
        DORMANT_FOR + Duration::from_secs(10),
        || {
            fs::read(format!("/proc/{g}/cmdline"))
                .is_ok_and(|c| c == b"leasehold\0--leasehold-guardian\0")
                && fd_links(g).len() > 4
        },
    );
}

/// While its wrapper lives, a dormant guardian (found by its name, which it takes once set up)
/// holds nothing of the wrapper's: /dev/null on 0 and 1 (never the caller's stdout, whose
/// reader would wait for it), the wrapper's stderr on 2, its own end of the socket on 3 and
/// nothing else — no lease file, no lock, no mutex, and not the wrapper's end of the socket,
/// whose copy would hide the wrapper's death —, in a process group of its own, waiting in
/// ppoll. Looked at within its dormant second; a machine too slow for that tries again.
#[test]
fn a_dormant_guardian_holds_only_its_socket_and_the_standard_descriptors() {
    for attempt in 1..=3 {
        let s = Scene::new();
        let release = s.work.join("release");
        let script = format!(
            "while [ ! -e {r} ]; do sleep 0.02; done",
            r = release.display()
        );
        let t0 = Instant::now();
        let mut w = Proc::spawn(
            support::lh()
                .arg("run")
                .arg(&s.lock)
                .arg("-c")
                .arg(&script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
            "wrapper",
        );
        let (wrapper, guardian) = running_with_guardian(&s);
        let waits_in = blocked_in(guardian);
        let g = fd_links(guardian);
        let ours = fd_links(wrapper);
        let group = nix::unistd::getpgid(Some(Pid::from_raw(guardian)));
        let looked_after = t0.elapsed();
        fs::write(&release, "").unwrap();
        let st = w.wait_timeout(Duration::from_secs(10));
        assert_eq!(support::code(st), 0, "{}", w.stderr());
        if looked_after >= DORMANT_LOOK {
            eprintln!(
                "attempt {attempt}: looked {looked_after:?} after the start, too near the end \
                 of the dormant {DORMANT_FOR:?}: again"
            );
            continue;
        }
        assert_eq!(waits_in, nix::libc::SYS_ppoll);
        assert_eq!(g.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3], "{g:?}");
        assert_eq!(g[&0], "/dev/null", "{g:?}");
        assert_eq!(g[&1], "/dev/null", "{g:?}");
        assert_eq!(
            g[&2], ours[&2],
            "stderr: {g:?} against the wrapper's {ours:?}"
        );
        assert!(g[&3].starts_with("socket:"), "{g:?}");
        assert!(
            !ours.values().any(|l| *l == g[&3]),
            "the guardian's socket end is also the wrapper's: {g:?}, {ours:?}"
        );
        assert_eq!(group, Ok(Pid::from_raw(guardian)));
        return;
    }
    panic!("three attempts could not look at a dormant guardian within {DORMANT_LOOK:?}");
}

/// A guardian still needed after its dormant second takes memory of its own (a process sharing
/// the wrapper's dies with it under the OOM killer): it execs itself, then holds the lock's
/// descriptors the arming sent and waits for EOF in `read`; a group kill of the caller still
/// stops the whole tree within the grace.
#[test]
fn a_guardian_past_its_dormant_second_execs_itself_and_still_stops_the_tree() {
    let s = Scene::new();
    let sh = caller(&s, &s.old_job(false));
    let (_, g) = running_with_guardian(&s);
    wait_for_exec_past_the_dormant_second(g);
    assert_eq!(blocked_in(g), nix::libc::SYS_read);
    group_kill_stops_the_tree(&s, sh);
}

/// A memory cgroup (v1 `memory` controller, or v2 with `memory` enabled) of its own, with a
/// limit; its processes killed and the group removed on drop.
struct MemCgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl MemCgroup {
    /// `None` when this host offers none to root (the caller skips).
    fn new(limit: u64) -> Option<MemCgroup> {
        let name = format!("leasehold-test-{}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let (dir, max) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else if fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
        {
            (PathBuf::from("/sys/fs/cgroup").join(&name), "memory.max")
        } else {
            return None;
        };
        fs::create_dir(&dir).ok()?;
        let cg = MemCgroup {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        fs::write(cg.dir.join(max), limit.to_string()).ok()?;
        Some(cg)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            let pids = fs::read_to_string(&self.procs).unwrap_or_default();
            for p in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The OOM killer, choosing the wrapper (its `oom_score_adj` raised to 1000) once its guardian's
/// dormant second is over: the guardian, with memory of its own by then, outlives it and stops
/// the whole tree within the grace, saying so. A real memory cgroup, filled from a tmpfs file
/// by a process of its own; root only. (Within that second the guardian shares the wrapper's
/// memory and the OOM killer takes both: PROTOCOL.md §7.)
#[test]
fn an_oom_killed_wrapper_past_the_dormant_second_has_its_tree_stopped_within_the_grace() {
    if support::skip(!support::is_root(), "needs root for a memory cgroup") {
        return;
    }
    let cg = MemCgroup::new(64 << 20);
    if support::skip(cg.is_none(), "no memory cgroup controller on this host") {
        return;
    }
    let cg = cg.unwrap();
    let s = Scene::new();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ > \"$1\"; exec \"$0\" run --grace 1s \"$2\" -c \"$3\"")
        .arg(support::bin())
        .arg(&cg.procs)
        .arg(&s.lock)
        .arg(s.old_job(true))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut w = Proc::spawn(c, "wrapper");
    let tree = s.tree();
    let (wrapper, g) = running_with_guardian(&s);
    assert_eq!(wrapper, w.pid(), "the wrapper is the spawned shell, exec'd");
    wait_for_exec_past_the_dormant_second(g);
    fs::write(format!("/proc/{wrapper}/oom_score_adj"), "1000").unwrap();
    // Page cache on tmpfs, charged to the cgroup and to no process's size: the filler stays
    // small, so the OOM killer's first choice is the wrapper. It stops once the wrapper is
    // dead; should its write still find no room (the wrapper freed little), the killer's next
    // choice is the filler itself (1000 too), never the guardian or the tree (0).
    let fill = PathBuf::from(format!("/dev/shm/leasehold-oomfill-{}", std::process::id()));
    let mut filler = Command::new("sh")
        .arg("-c")
        .arg(
            "echo $$ > \"$0\"; echo 1000 > /proc/$$/oom_score_adj
             while [ -e /proc/$2 ] && [ \"$(cut -d' ' -f3 /proc/$2/stat)\" != Z ]; do
               head -c 262144 /dev/zero >> \"$1\" || break
             done",
        )
        .arg(&cg.procs)
        .arg(&fill)
        .arg(wrapper.to_string())
        .spawn()
        .unwrap();
    let st = w.wait_timeout(Duration::from_secs(30));
    let t0 = Instant::now();
    let _ = filler.kill();
    let _ = filler.wait();
    let _ = fs::remove_file(&fill);
    assert_eq!(
        st.signal(),
        Some(nix::libc::SIGKILL),
        "the wrapper was not OOM-killed: {st:?}"
    );
    tree_gone(&tree, t0);
    let said = w.wait_line(Duration::from_secs(5), |l| {
        l.contains("its guardian stopped")
    });
    assert!(said.is_some(), "no guardian line:\n{}", w.stderr_so_far());
    drop(cg);
}

/// Script mode (`leasehold lock`): the keeper lives in a session of its own, so a group kill of
/// the script's job does not reach it; it sees the script die (its pidfd) and releases at once,
/// what the script started in its group being dead with it. No hole to close there: the lease
/// never lapses under a running job, and a contender runs at once after the cancel.
#[test]
fn group_kill_of_a_script_holding_the_lock_releases_it_at_once() {
    let s = Scene::new();
    let bg = s.work.join("bg");
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("eval \"$(\"$0\" lock \"$1\")\" || exit 1; sleep 300 & echo $! > \"$2\"; wait")
        .arg(support::bin())
        .arg(&s.lock)
        .arg(&bg)
        .env_remove("LEASEHOLD_LOCK")
        .env_remove("LEASEHOLD_LEASE_ID")
        .env_remove("LEASEHOLD_TOKEN")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut sh = Proc::spawn(c, "script");
    support::ensure_within("the script's job to start", Duration::from_secs(10), || {
        fs::read_to_string(&bg).is_ok_and(|t| t.ends_with('\n'))
    });
    let bg: i32 = fs::read_to_string(&bg).unwrap().trim().parse().unwrap();
    let tree = [(bg, support::start_time(bg).unwrap())];
    let t0 = Instant::now();
    killpg(Pid::from_raw(sh.pid()), Signal::SIGKILL).unwrap();
    sh.wait_timeout(Duration::from_secs(5));
    tree_gone(&tree, t0);
    support::ensure_within("the keeper to release", GRACE + SLACK, || {
        support::lease(&s.lock).is_some_and(|l| l["state"] == "released")
    });
    support::lh_run(&["-n"], &s.lock, &["--", "true"]).success();
}
