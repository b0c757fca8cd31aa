//! Hostile input: what sits at LOCK is not ours, or lies. Each case gets a clear error
//! and a documented exit code (65 not a lease, 77 permission, 75 refused), the command never
//! runs, and nothing is modified (bytes, mtime, inode, mode and owner compared before/after).
//! - LOCK is a symlink to another user's file, a directory, a FIFO, a 1 GiB sparse file;
//!   truncated, garbage, deeply nested or oversized JSON; a lease of format version 2.
//! - A lease naming a live process that is not a leasehold holder (pid 1, a root process of the
//!   test's own, another user's process), with a heartbeat that never moves: the processes of
//!   the test's own, which would die of a SIGKILL or SIGTERM and show a SIGSTOP, are never
//!   signalled; a lease naming pid 1 or another user's process is never taken over (one naming
//!   a process of the contender's own uid, checkable as no holder of this lock, may be).
//! - The lock directory is not writable (the error names the directory and the
//!   `.NAME.leasehold-*` files leasehold keeps there); LOCK is owned by another user (contender
//!   run as `nobody` with setpriv).

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{Proc, bounded};

/// How long a call may take before it counts as hung (blocked, e.g. opening a FIFO).
const LIMIT: Duration = Duration::from_secs(20);

/// A held lease of this host for `pid` (started at `start`) of `uid` (root, or else "nobody").
fn valid_lease_bytes(pid: i32, start: u64, uid: u32, pgid: Option<i32>) -> Vec<u8> {
    let who = leasehold::Identity {
        uid,
        user: if uid == 0 { "root" } else { "nobody" }.into(),
        ..leasehold::Identity::current()
    };
    let mut l = support::crafted(pid, start, &who, Duration::from_millis(200), 7);
    l.lease_id = "0123456789abcdef0123456789abcdef".into();
    l.holder.pgid = pgid;
    l.holder.command = vec!["forged".into()];
    l.holder.note = None;
    l.to_bytes()
}

fn cli_run(lock: &Path, marker: &Path) -> (i32, String) {
    let out = Command::new(support::bin())
        .args(["run", "-n", "--ttl", "200ms"])
        .arg(lock)
        .args(["--", "touch"])
        .arg(marker)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        support::code(out.status),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn new_entries(dir: &Path, before: &[String]) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !before.contains(n))
        .collect();
    v.sort();
    v
}

fn listing(dir: &Path) -> Vec<String> {
    new_entries(dir, &[])
}

#[test]
fn hostile_files_at_lock_are_refused_untouched() {
    let root = support::is_root();
    let other_user_file = tempfile::NamedTempFile::new().unwrap();
    fs::write(other_user_file.path(), "someone else's data\n").unwrap();
    if root {
        std::os::unix::fs::chown(other_user_file.path(), Some(65534), Some(65534)).unwrap();
    }
    let valid = valid_lease_bytes(4242, 1, 0, None);
    // Under the 64 KiB size cap, so the parser itself meets the nesting.
    let mut deep = vec![b'['; 30_000];
    deep.extend(vec![b']'; 30_000]);
    let mut big = b"{\"leasehold\": 1, \"pad\": \"".to_vec();
    big.extend(vec![b'x'; 100_000]);
    big.extend(b"\"}");
    type Setup = Box<dyn Fn(&Path)>;
    let target = other_user_file.path().to_path_buf();
    let cases: Vec<(&str, Setup)> = vec![
        (
            "symlink to another user's file",
            Box::new(move |p: &Path| std::os::unix::fs::symlink(&target, p).unwrap()),
        ),
        ("directory", Box::new(|p: &Path| fs::create_dir(p).unwrap())),
        (
            "FIFO",
            Box::new(|p: &Path| {
                nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
            }),
        ),
        (
            "1 GiB sparse file",
            Box::new(|p: &Path| fs::File::create(p).unwrap().set_len(1 << 30).unwrap()),
        ),
        (
            "truncated lease",
            Box::new(move |p: &Path| fs::write(p, &valid[..valid.len() / 2]).unwrap()),
        ),
        (
            "garbage",
            Box::new(|p: &Path| fs::write(p, [0u8, 0xff, 0x13, 0x37, b'{', 0x80, 0x81]).unwrap()),
        ),
        (
            "pid text (flock/pidfile style)",
            Box::new(|p: &Path| fs::write(p, "4242\n").unwrap()),
        ),
        (
            "deeply nested JSON",
            Box::new(move |p: &Path| fs::write(p, &deep).unwrap()),
        ),
        (
            "oversized JSON",
            Box::new(move |p: &Path| fs::write(p, &big).unwrap()),
        ),
        (
            "future format version",
            Box::new(|p: &Path| {
                fs::write(p, br#"{"leasehold": 2, "state": "held", "lease_id": "x"}"#).unwrap()
            }),
        ),
    ];
    let mut lines = Vec::new();
    for (what, setup) in cases {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        setup(&lock);
        let before_dir = listing(dir.path());
        let snap = support::snapshot(&lock);
        let snap_target = support::snapshot(other_user_file.path());
        // Library.
        let l2 = lock.clone();
        let err = bounded(what, LIMIT, move || {
            leasehold::LeaseBuilder::new(&l2)
                .ttl(Duration::from_millis(200))
                .try_acquire()
                .map(|_| ())
        })
        .expect_err(&format!("{what}: acquired"));
        assert!(
            matches!(
                err,
                leasehold::Error::NotALease { .. } | leasehold::Error::NewerFormat { .. }
            ),
            "{what}: unexpected error {err:?}"
        );
        assert_eq!(leasehold_cli::exit_code(&err), 65, "{what}: {err}");
        let l3 = lock.clone();
        let st = bounded(what, LIMIT, move || leasehold::status(&l3).map(|_| ()));
        assert!(st.is_err(), "{what}: status judged it a lease");
        // CLI.
        let marker = dir.path().with_extension("ran");
        let (code, err) = cli_run(&lock, &marker);
        assert_eq!(code, 65, "{what}: leasehold run exited {code}: {err}");
        assert!(!marker.exists(), "{what}: the command ran");
        let cli = format!("exit {code}: {}", err.trim());
        assert_eq!(support::snapshot(&lock), snap, "{what}: LOCK was modified");
        assert_eq!(
            support::snapshot(other_user_file.path()),
            snap_target,
            "{what}: the symlink target was modified"
        );
        let new = new_entries(dir.path(), &before_dir);
        let helpers = [".job.lock.leasehold-mutex"];
        assert!(
            new.iter().all(|n| helpers.contains(&n.as_str())),
            "{what}: files created beside LOCK: {new:?}"
        );
        lines.push(format!("faults: hostile: {what}: library -> {err}; {cli}"));
    }
    for l in lines {
        println!("{l}");
    }
}

/// A lease naming a live process that is not a leasehold holder, with a heartbeat that never
/// moves: contenders must never signal that process (nor take over without stopping it). Pid 1
/// would survive any signal unharmed (it ignores those it has no handler for), so the
/// never-signalled checks are made on processes of the test's own: a root `sleep` named like
/// pid 1 is (right start time, uid 0), and another user's `sleep`; each must still be running
/// (not dead, not a zombie, not stopped).
#[test]
fn lease_naming_pid_1_a_root_process_or_another_users_process_never_signals_it() {
    if support::need_root() || support::need_tools(&["setpriv", "sleep"]) {
        return;
    }
    let ttl = Duration::from_millis(200);
    // Another user's process, in its own process group.
    let mut victim = spawn_victim();
    let nobody_up = |v: &Proc| {
        support::wait_until(Duration::from_secs(5), || {
            support::uid(v.pid()) == Some(65534)
        })
    };
    assert!(nobody_up(&victim), "the other user's process did not start");
    // A root process of our own, in its own process group.
    let mut c = Command::new("sleep");
    c.arg("600").stdin(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let mut root_victim = Proc::spawn(&mut c, "root victim");
    let root_pid = root_victim.pid();
    let root_start = support::start_time(root_pid).expect("root victim's start time");
    let init_start = support::start_time(1).expect("pid 1's start time");
    let init_uid = support::uid(1).expect("pid 1's uid");
    /// (pid, start time, process group) of the victim.
    type Victim = (i32, u64, i32);
    type Forge = Box<dyn Fn(Victim) -> Vec<u8>>;
    // (what, forged lease, whether taking over is right). A lease whose recorded holder is
    // gone is stale: taking it over is right, but the unrelated processes in the group it names
    // (a reused or forged group id) must never be signalled. A lease naming live processes that
    // are provably not leasehold's must be neither signalled nor taken over.
    let cases: Vec<(&str, Forge, bool)> = vec![
        (
            "pid 1 (right start time, uid 0)",
            Box::new(move |_| valid_lease_bytes(1, init_start, init_uid, None)),
            false,
        ),
        // Our own uid's process can be checked (its environment and descriptors show it is no
        // holder of this lock), so taking the lease over is right; signalling it is not.
        (
            "a live root process (right start time, uid 0)",
            Box::new(move |_| valid_lease_bytes(root_pid, root_start, 0, Some(root_pid))),
            true,
        ),
        (
            "another user's live process",
            Box::new(|(pid, start, _)| valid_lease_bytes(pid, start, 65534, None)),
            false,
        ),
        (
            "another user's process group, holder gone",
            Box::new(|(_, _, pgrp)| valid_lease_bytes(ns_free_pid(), 12345, 65534, Some(pgrp))),
            true,
        ),
    ];
    let mut lines = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for (what, forge, may_take_over) in cases {
        assert!(nobody_up(&victim), "the other user's process did not start");
        let vpid = victim.pid();
        let bytes = forge((
            vpid,
            support::start_time(vpid).expect("victim's start time"),
            support::pgrp(vpid).expect("victim's group"),
        ));
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        fs::write(&lock, &bytes).unwrap();
        let snap = support::snapshot(&lock);
        // Contend for 3 TTLs (the heartbeat never moves), in-process and with the CLI.
        let end = std::time::Instant::now() + ttl * 3;
        let mut outcomes = Vec::new();
        while std::time::Instant::now() < end {
            let r = leasehold::LeaseBuilder::new(&lock).ttl(ttl).try_acquire();
            match r {
                Ok(g) => {
                    outcomes.push("TOOK OVER".to_string());
                    drop(g);
                    break;
                }
                Err(e) => outcomes.push(format!("{} ({})", leasehold_cli::exit_code(&e), e)),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (code, err) = cli_run(&lock, &dir.path().join("ran"));
        outcomes.push(format!("cli {code} ({})", err.trim()));
        let last = outcomes.last().cloned().unwrap_or_default();
        if root_victim.try_wait().is_some() || !support::running(root_pid) {
            failures.push(format!(
                "{what}: the root process of our own was signalled (state {:?}); last outcome: {last}",
                support::proc_state(root_pid)
            ));
            break;
        }
        if victim.try_wait().is_some() || !support::running(victim.pid()) {
            failures.push(format!(
                "{what}: the other user's process was killed by a contender; last outcome: {last}"
            ));
            // A fresh victim for the next case.
            victim.kill();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-vpid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .ok();
            victim = spawn_victim();
        } else if outcomes
            .iter()
            .any(|o| o.contains("after SIGKILL") || (!may_take_over && o.contains("TOOK OVER")))
        {
            failures.push(format!(
                "{what}: a contender signalled the named process or took over without stopping it; last outcome: {last}"
            ));
        }
        if !may_take_over && support::snapshot(&lock) != snap {
            failures.push(format!("{what}: LOCK was modified; last outcome: {last}"));
        }
        lines.push(format!(
            "faults: hostile: lease naming {what}: last outcome: {last}"
        ));
    }
    victim.kill();
    root_victim.kill();
    for l in lines {
        println!("{l}");
    }
    assert!(failures.is_empty(), "BUG: {}", failures.join("\n"));
}

/// Another user's process (`sleep 600` as nobody), in its own process group.
fn spawn_victim() -> Proc {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "sleep",
        "600",
    ])
    .stdin(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    Proc::spawn(&mut c, "victim")
}

fn ns_free_pid() -> i32 {
    (2_000_000..4_000_000)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap_or(3_999_999)
}

/// Runs a one-shot contender (`leasehold run -n`) as `nobody`. Returns (exit code, stderr).
fn as_nobody(lock: &Path, marker: &Path) -> (i32, String) {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    c.arg(support::bin())
        .args(["run", "-n", "--ttl", "200ms"])
        .arg(lock)
        .args(["--", "touch"])
        .arg(marker);
    let out = c.stdin(Stdio::null()).output().unwrap();
    (
        support::code(out.status),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unwritable_dir_and_lock_of_another_user_exit_77_untouched() {
    if support::need_root() || support::need_tools(&["setpriv"]) {
        return;
    }
    // The test binary must be reachable by nobody.
    let exe: PathBuf = support::bin();
    let reachable = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "test",
            "-x",
        ])
        .arg(&exe)
        .status()
        .is_ok_and(|s| s.success());
    if support::skip(
        !reachable,
        &format!("{} is not executable by nobody", exe.display()),
    ) {
        return;
    }
    let mut lines = Vec::new();
    // 1. A directory nobody cannot write, no LOCK yet.
    {
        let d = support::tmp_dir_with_mode("faults-perm-", 0o755);
        let lock = d.path().join("job.lock");
        let marker = Path::new("/tmp").join(format!("faults-ran-{}", std::process::id()));
        let before = listing(d.path());
        let (code, err) = as_nobody(&lock, &marker);
        assert_eq!(code, 77, "unwritable dir: exit {code}: {err}");
        assert!(
            err.to_lowercase().contains("permission denied"),
            "unclear: {err}"
        );
        // In the user's terms: which directory, and why leasehold writes there.
        let want = format!(
            "leasehold needs write access to {} (it keeps .job.lock.leasehold-* files there)",
            fs::canonicalize(d.path()).unwrap().display()
        );
        assert!(err.contains(&want), "not in the user's terms: {err}");
        assert!(!marker.exists(), "the command ran");
        assert_eq!(
            listing(d.path()),
            before,
            "files created in an unwritable dir"
        );
        lines.push(format!(
            "faults: hostile: unwritable lock dir (as nobody): exit {code}: {}",
            err.trim()
        ));
    }
    // 2. LOCK (a released lease) owned by root in a sticky world-writable dir.
    {
        let d = support::tmp_dir_with_mode("faults-perm-", 0o1777);
        let lock = d.path().join("job.lock");
        let root = leasehold::Identity {
            uid: 0,
            user: "root".into(),
            ..leasehold::Identity::current()
        };
        let mut l = support::crafted(4242, 1, &root, Duration::from_millis(200), 9);
        l.state = leasehold::LeaseState::Released;
        l.heartbeat_seq = 3;
        l.lease_id = "00000000000000000000000000000001".into();
        l.holder.command = vec!["job".into()];
        l.holder.note = None;
        l.ended = Some(leasehold::Ending {
            at: l.acquired_at.clone(),
            how: "exit 0".into(),
            by: None,
        });
        let bytes = l.to_bytes();
        fs::write(&lock, &bytes).unwrap();
        let snap = support::snapshot(&lock);
        let before = listing(d.path());
        let marker = Path::new("/tmp").join(format!("faults-ran2-{}", std::process::id()));
        let (code, err) = as_nobody(&lock, &marker);
        assert_eq!(code, 77, "LOCK of another user: exit {code}: {err}");
        // Who may replace it is named once each: root owns both the file and the directory.
        assert!(
            err.contains("only root can replace it"),
            "who may replace it, named once: {err}"
        );
        assert!(!marker.exists(), "the command ran");
        assert_eq!(support::snapshot(&lock), snap, "LOCK was modified");
        let new = new_entries(d.path(), &before);
        assert!(
            !new.iter().any(|n| n.contains("leasehold-tmp")),
            "temp file left behind: {new:?}"
        );
        lines.push(format!(
            "faults: hostile: LOCK owned by root in a sticky dir (as nobody): exit {code}: {}; new helper files: {new:?}",
            err.trim()
        ));
    }
    for l in lines {
        println!("{l}");
    }
}
