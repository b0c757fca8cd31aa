//! Storage faults, on a private tmpfs (root only):
//! - full disk: a holder keeps its lease (renewals in place) for ≥ 3 TTLs on a 100 % full file
//!   system and still leaves a lease every contender judges free; a new acquisition fails with
//!   a clear "no space" error (exit 73) and leaves no LOCK and no temp file behind;
//! - storage turns read-only mid-hold (remount ro; lazy unmount when the kernel says EBUSY): the
//!   holder is lost, and `leasehold run` fences its command and exits 74, before the TTL counted
//!   from the last heartbeat anyone could have seen;
//! - storage vanishes mid-hold (lazy unmount): the same.
//! - the read-only remount also under a holder that took over an existing LOCK: the file its
//!   lease replaced is let go of at the holder's first renewal when nobody else has it open,
//!   else (the holder and `run`'s guardian) within seconds after the last other opener closed it.
//! - (a real ext4 on a loop device) the disk drops off under a holder and what reached it comes
//!   back as a new device in the same boot: either the lease is on it (the first lease of a
//!   mount epoch is synced), or, for a lease that was not synced, the epoch record names the old
//!   device and every contender waits out the longest TTL; either way a new run there waits
//!   until the old command, fenced by its wrapper, is gone, and tokens still grow.
//!
//! Each runs through the library and through `leasehold run`.

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Cs, LoopExt4, Proc, Tmpfs};

fn work() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Reads the lease key (id, heartbeat sequence, state) through an open descriptor: it keeps
/// working after a lazy unmount, when the path no longer leads to the file.
fn key_fd(f: &fs::File) -> Option<(String, u64, String)> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 65536];
    let n = f.read_at(&mut buf, 0).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&buf[..n]).ok()?;
    Some((
        v["lease_id"].as_str()?.to_string(),
        v["heartbeat_seq"].as_u64()?,
        v["state"].as_str()?.to_string(),
    ))
}

type Key = Option<(String, u64, String)>;

/// Reads the lease key with `read` every millisecond for `dur`; returns how many times it
/// moved, when it was last seen to move, and the last key seen.
fn watch(read: impl Fn() -> Key, dur: Duration) -> (u64, Instant, Key) {
    let end = Instant::now() + dur;
    let mut last = read();
    let mut moved = 0;
    let mut at = Instant::now();
    while Instant::now() < end {
        let k = read();
        if k.is_some() && k != last {
            moved += 1;
            at = Instant::now();
            last = k;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (moved, at, last)
}

/// [`watch`] of LOCK's heartbeats by path: how many times they moved.
fn watch_heartbeats(lock: &Path, dur: Duration) -> u64 {
    watch(|| support::lease_key(lock), dur).0
}

/// After the storage was pulled: if a heartbeat landed between the end of watching and the
/// pull, count it as seen right at the end of watching (the strictest plausible time).
fn last_heartbeat(f: &fs::File, at: Instant, key: &Key, watch_end: Instant) -> Instant {
    let now = key_fd(f);
    if now.is_some() && now != *key {
        watch_end
    } else {
        at
    }
}

#[test]
fn full_disk_library_holder_keeps_lease_and_new_acquire_fails_cleanly() {
    if support::need_root() || support::need_tools(&["mount", "umount", "dd"]) {
        return;
    }
    let ttl = Duration::from_millis(300);
    let fs_ = Tmpfs::new("512k");
    let lock = fs_.dir.join("job.lock");
    let g = leasehold::LeaseBuilder::new(&lock)
        .ttl(ttl)
        .try_acquire()
        .expect("acquire before the disk is full");
    fs_.fill("fill");
    let moved = watch_heartbeats(&lock, ttl * 4);
    assert!(!g.is_lost(), "lost on a full disk: {:?}", g.loss());
    assert!(
        moved >= 6,
        "only {moved} heartbeats in 4 TTLs on a full disk"
    );
    let v = leasehold::status(&lock).expect("status on a full disk");
    assert_eq!(v.state, leasehold::State::Held, "{v}");
    // Release on a full disk: the released record cannot be written, but ours is marked
    // released in place, so the next contender judges it free at once.
    let r = g.release();
    let v = leasehold::status(&lock).expect("status");
    assert_eq!(
        v.state,
        leasehold::State::Free,
        "after release on a full disk ({r:?}): {v}"
    );
    println!(
        "faults: full disk (library): heartbeats_in_4_ttls={moved} release={}",
        match &r {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("marked in place ({e})"),
        }
    );

    // A new acquisition on a full disk (a different LOCK in the same full directory).
    let lock2 = fs_.dir.join("new.lock");
    let before: Vec<_> = listing(&fs_.dir);
    let err = leasehold::LeaseBuilder::new(&lock2)
        .ttl(ttl)
        .try_acquire()
        .expect_err("acquired on a full disk");
    assert!(err.is_no_space(), "not a no-space error: {err}");
    assert_eq!(leasehold_cli::exit_code(&err), 73, "{err}");
    assert!(
        err.to_string().to_lowercase().contains("no space"),
        "unclear error: {err}"
    );
    check_nothing_left(&fs_.dir, "new.lock", &before);
    println!("faults: full disk (library): new acquisition -> {err}");
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// No LOCK and no temp file appeared; an (empty) mutex file is the only thing tolerated, and is
/// reported.
fn check_nothing_left(dir: &Path, name: &str, before: &[String]) {
    let after = listing(dir);
    let new: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    assert!(!dir.join(name).exists(), "LOCK was created on a full disk");
    let tmp = format!(".{name}.leasehold-tmp");
    assert!(
        !after.iter().any(|n| n.starts_with(&tmp)),
        "temp file left behind on a full disk: {after:?}"
    );
    let mutex = format!(".{name}.leasehold-mutex");
    for n in &new {
        assert_eq!(**n, mutex, "left behind on a full disk: {n}");
    }
    if !new.is_empty() {
        let len = fs::metadata(dir.join(&mutex)).map(|m| m.len()).unwrap_or(0);
        println!("faults: full disk: note: the failed acquisition left {mutex} ({len} bytes)");
    }
}

fn run_cmd(lock: &Path, ttl: &str, extra: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(support::bin());
    c.arg("run")
        .args(["--ttl", ttl])
        .args(extra)
        .arg(lock)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Starts `leasehold run --ttl TTL LOCK -- sh -c SCRIPT` and waits (5 s at most) until its
/// script has created `ready`.
#[track_caller]
fn start_holder(lock: &Path, ttl: &str, script: &str, ready: &Path) -> Proc {
    let holder = Proc::spawn(
        &mut run_cmd(lock, ttl, &[], &["sh", "-c", script]),
        "holder",
    );
    assert!(
        support::wait_until(Duration::from_secs(5), || ready.exists()),
        "holder never ran"
    );
    holder
}

fn stderr_of(k: &mut Proc) -> String {
    k.stderr()
}

#[test]
fn full_disk_cli_run_keeps_lease_and_new_run_exits_73() {
    if support::need_root() || support::need_tools(&["mount", "umount", "dd", "sh"]) {
        return;
    }
    let ttl = Duration::from_millis(400);
    let w = work();
    let ready = w.path().join("ready");
    let go = w.path().join("go");
    let fs_ = Tmpfs::new("512k");
    let lock = fs_.dir.join("job.lock");
    // The command says it runs, then waits (bounded) for the test to let it finish.
    let script = format!(
        "echo $LEASEHOLD_TOKEN > {r}; i=0; while [ ! -e {g} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done",
        r = ready.display(),
        g = go.display()
    );
    let mut holder = start_holder(&lock, "400ms", &script, &ready);
    fs_.fill("fill");
    let moved = watch_heartbeats(&lock, ttl * 4);
    assert!(
        holder.try_wait().is_none(),
        "holder exited on a full disk: {}",
        stderr_of(&mut holder)
    );
    assert!(
        moved >= 6,
        "only {moved} heartbeats in 4 TTLs on a full disk"
    );
    fs::write(&go, "").unwrap();
    let st = holder.wait_timeout(Duration::from_secs(10));
    let err = stderr_of(&mut holder);
    assert_eq!(support::code(st), 0, "holder on a full disk: {err}");
    let v = leasehold::status(&lock).expect("status");
    assert_eq!(
        v.state,
        leasehold::State::Free,
        "after the run ended on a full disk: {v}"
    );
    println!(
        "faults: full disk (leasehold run): held 4 TTLs, heartbeats={moved}, exit 0, then free"
    );

    let before = listing(&fs_.dir);
    let marker = w.path().join("ran");
    let mut k = Proc::spawn(
        &mut run_cmd(
            &fs_.dir.join("new.lock"),
            "400ms",
            &["-n"],
            &["touch", marker.to_str().unwrap()],
        ),
        "new run",
    );
    let st = k.wait_timeout(Duration::from_secs(10));
    let err = stderr_of(&mut k);
    assert_eq!(support::code(st), 73, "new run on a full disk: {err}");
    assert!(
        err.to_lowercase().contains("no space"),
        "unclear error: {err}"
    );
    assert!(!marker.exists(), "the command ran without a lease");
    check_nothing_left(&fs_.dir, "new.lock", &before);
    println!(
        "faults: full disk (leasehold run): new run -> exit 73: {}",
        err.trim()
    );
}

/// Makes the storage go away under a holder: remount read-only (retrying while the kernel says
/// EBUSY, for `patience`, calling `between` after each refusal; then falling back to a lazy
/// unmount), or a lazy unmount outright.
fn pull_storage(
    fs_: &Tmpfs,
    read_only: bool,
    patience: Duration,
    mut between: impl FnMut(),
) -> &'static str {
    if read_only {
        let until = Instant::now() + patience;
        loop {
            if fs_.remount_ro() {
                return "remounted read-only";
            }
            between();
            if Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert!(fs_.lazy_unmount(), "lazy unmount failed");
    if read_only {
        "lazily unmounted (remount refused: EBUSY)"
    } else {
        "lazily unmounted"
    }
}

/// Watches LOCK's heartbeats (through an open descriptor) for `dur`, then pulls the storage
/// ([`pull_storage`], watching on between refused remounts); returns how, and when the last
/// heartbeat was seen ([`last_heartbeat`]). A holder keeps nothing open for writing, and no
/// unlinked file once nobody else has it open, so the file system must be able to go read-only
/// under it — within `patience` (the time the holder may take to let go of a replaced file).
fn pull_storage_watched(
    fs_: &Tmpfs,
    lock: &Path,
    dur: Duration,
    read_only: bool,
    patience: Duration,
) -> (&'static str, Instant) {
    let f = fs::File::open(lock).expect("open LOCK");
    let (_, mut at, mut key) = watch(|| key_fd(&f), dur);
    let mut watch_end = Instant::now();
    let pulling = Instant::now();
    let how = pull_storage(fs_, read_only, patience, || {
        let k = key_fd(&f);
        if k.is_some() && k != key {
            (at, key) = (Instant::now(), k);
        }
        watch_end = Instant::now();
    });
    assert!(
        !read_only || how == "remounted read-only",
        "the holder kept the file system from going read-only: {how}"
    );
    println!(
        "faults: storage {how} {} ms after the first try",
        pulling.elapsed().as_millis()
    );
    (how, last_heartbeat(&f, at, &key, watch_end))
}

/// What LOCK was when the holder took it. A take over an existing LOCK renames over its file,
/// which the holder keeps (with its claim) only while someone else has it open, as its
/// renewals check (PROTOCOL.md §3): an unlinked file kept open would stop the read-only remount.
#[derive(Clone, Copy, Debug)]
enum Before {
    /// No LOCK: the holder creates it.
    Fresh,
    /// A released lease left by a run that has ended: nobody has its file open at the take.
    Ended,
    /// A released lease whose file someone else has open at the take (as a released holder
    /// that has not closed it yet, or a `status` look, would), closed once the holder holds:
    /// the holder, and `run`'s guardian, let go of it within a few seconds.
    StillOpen,
}

/// The cases the read-only tests run: a fresh LOCK, and a take over an existing one, whose old
/// file is let go of at once or later.
const READ_ONLY_CASES: [(bool, Before); 4] = [
    (true, Before::Fresh),
    (true, Before::Ended),
    (true, Before::StillOpen),
    (false, Before::Fresh),
];

/// Lays LOCK down as `before` says, before the holder takes it: what the test itself keeps open
/// of it (closed once the holder holds).
fn lay_before(lock: &Path, before: Before) -> Option<fs::File> {
    if matches!(before, Before::Fresh) {
        return None;
    }
    let st = support::lh()
        .arg("run")
        .arg(lock)
        .args(["--", "true"])
        .stderr(Stdio::null())
        .status()
        .expect("run leasehold");
    assert!(st.success(), "an earlier run on {}: {st}", lock.display());
    matches!(before, Before::StillOpen).then(|| fs::File::open(lock).expect("open LOCK"))
}

/// How long a read-only remount may be refused once the storage is pulled, for `before`: a
/// file nobody else had open is let go of at the holder's first renewal (TTL/3, inside the
/// heartbeats watched before the pull), and never passed to `run`'s guardian; one someone had
/// open, at the holder's first renewal after it was closed, and within two seconds of the
/// guardian's start (it looks once a second).
fn patience(before: Before) -> Duration {
    match before {
        Before::StillOpen => Duration::from_secs(10),
        Before::Fresh | Before::Ended => Duration::from_millis(100),
    }
}

fn storage_fails_library(read_only: bool, before: Before) -> (Duration, &'static str) {
    let ttl = Duration::from_millis(600);
    let fs_ = Tmpfs::new("4m");
    let lock = fs_.dir.join("job.lock");
    let kept = lay_before(&lock, before);
    let g = leasehold::LeaseBuilder::new(&lock)
        .ttl(ttl)
        .try_acquire()
        .expect("acquire");
    drop(kept);
    // Let a few heartbeats pass and note when the last one was seen.
    let (how, last_seen) = pull_storage_watched(&fs_, &lock, ttl, read_only, patience(before));
    let reason = g.wait_lost(ttl * 2);
    let lost_at = Instant::now();
    assert!(reason.is_some(), "{how}: guard not lost within 2 TTLs");
    let before_ttl = (last_seen + ttl).saturating_duration_since(lost_at);
    assert!(
        lost_at < last_seen + ttl,
        "{how}: guard lost {:?} after the last heartbeat, not before the TTL {ttl:?}",
        lost_at - last_seen
    );
    drop(g);
    (before_ttl, how)
}

#[test]
fn storage_read_only_or_vanished_library_guard_is_lost_before_ttl() {
    if support::need_root() || support::need_tools(&["mount", "umount", "true"]) {
        return;
    }
    for (ro, before) in READ_ONLY_CASES {
        let (margin, how) = storage_fails_library(ro, before);
        println!(
            "faults: storage {how} (library, LOCK {before:?}): guard lost {} ms before the TTL (ttl_ms=600)",
            margin.as_millis()
        );
    }
}

fn storage_fails_cli(read_only: bool, before: Before) -> (Duration, &'static str) {
    let ttl = Duration::from_millis(800);
    let w = work();
    let ready = w.path().join("ready");
    let fs_ = Tmpfs::new("4m");
    let lock = fs_.dir.join("job.lock");
    let kept = lay_before(&lock, before);
    // A command with grandchildren that ignore nothing: fencing must reach the whole group.
    let script = format!(
        "echo $$ > {r}.pid; sleep 60 & sleep 60 & echo x > {r}; wait",
        r = ready.display()
    );
    let mut holder = start_holder(&lock, "800ms", &script, &ready);
    let cmd_pid: i32 = fs::read_to_string(PathBuf::from(format!("{}.pid", ready.display())))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pgid = support::pgrp(cmd_pid).expect("the command's group");
    // The wrapper records its command in the lease (a rename): watch the record that has it.
    support::wait_for_child(&lock);
    drop(kept);
    let (how, last_seen) = pull_storage_watched(&fs_, &lock, ttl / 2, read_only, patience(before));
    let st = holder.wait_timeout(ttl * 4);
    let exited = Instant::now();
    let err = stderr_of(&mut holder);
    assert_eq!(support::code(st), 74, "{how}: leasehold run: {err}");
    let left = support::group(pgid);
    assert!(
        left.is_empty(),
        "{how}: fenced command's group still has {left:?}"
    );
    assert!(
        exited < last_seen + ttl,
        "{how}: fenced {:?} after the last heartbeat, not before the TTL {ttl:?}",
        exited - last_seen
    );
    ((last_seen + ttl) - exited, how)
}

#[test]
fn storage_read_only_or_vanished_cli_fences_before_ttl_exit_74() {
    if support::need_root() || support::need_tools(&["mount", "umount", "sh", "sleep", "true"]) {
        return;
    }
    for (ro, before) in READ_ONLY_CASES {
        let (margin, how) = storage_fails_cli(ro, before);
        println!(
            "faults: storage {how} (leasehold run, LOCK {before:?}): command fenced, exit 74, {} ms before the TTL (ttl_ms=800)",
            margin.as_millis()
        );
    }
}

/// A disk that drops off and comes back in the same boot is a new superblock, read from what
/// reached the disk, while the old holder still runs on descriptors into the dead one
/// (PROTOCOL.md §8, "Durable per mount epoch"). Here the holder is the first on a fresh disk:
/// it writes the epoch record and syncs its lease with it, so the new mount shows the lease and
/// the next run waits for the fenced command (the case of a lease that was not synced is the
/// next test).
#[test]
fn a_disk_that_drops_off_and_comes_back_in_the_same_boot_still_shows_the_lease_so_jobs_never_overlap()
 {
    if support::need_root()
        || support::need_tools(&["losetup", "mkfs.ext4", "truncate", "mount", "umount", "sh"])
    {
        return;
    }
    let disk = match LoopExt4::new() {
        Ok(d) => d,
        Err(why) => {
            support::skip(true, &format!("cannot attach a loop device here: {why}"));
            return;
        }
    };
    let w = work();
    let cs = Cs::new(w.path(), "cs");
    // The old command is fenced by its own wrapper when its disk fails: dead, undeclared,
    // by the time the next one enters.
    cs.allow_fenced();
    let lock = disk.mnt.join("job.lock");
    let mut old = Proc::spawn(
        support::lh()
            .args(cs.hold_args(&["--ttl", "2s"], &lock, "old"))
            .stderr(Stdio::piped()),
        "old run",
    );
    cs.wait_entered("old", Duration::from_secs(10));
    support::wait_for_child(&lock);
    let old_child = cs.job_pid("old").expect("the old job's pid");

    disk.shut_down();
    let back = disk.reattach().expect("attach what reached the disk");
    let lock_back = back.mnt.join("job.lock");
    let on_disk =
        support::lease(&lock_back).expect("the lease reached the disk before the command started");
    assert_eq!(
        on_disk["holder"]["pid"].as_i64(),
        Some(i64::from(old.pid())),
        "the lease on the disk names the running wrapper: {on_disk}"
    );

    let t = Instant::now();
    let mut next = Proc::spawn(
        support::lh()
            .args(cs.run_args(&["-w", "30s"], &lock_back, "next", 1))
            .stderr(Stdio::piped()),
        "next run",
    );
    let st = old.wait_timeout(Duration::from_secs(15));
    let old_err = old.stderr();
    assert_eq!(
        support::code(st),
        74,
        "the old run must fence its command when its disk fails: {old_err}"
    );
    assert!(
        old_err.contains("fenced"),
        "the old run said it fenced its command: {old_err}"
    );
    assert!(
        !support::alive(old_child),
        "the old command survived its fence"
    );
    let st = next.wait_timeout(Duration::from_secs(30));
    let err = next.stderr();
    assert_eq!(support::code(st), 0, "next run: {err}");
    let jobs = cs.verify();
    assert_eq!(jobs.len(), 2, "both jobs entered: {jobs:?}");
    assert!(
        err.contains(&old.pid().to_string()),
        "the next run said whom it waited for: {err}"
    );
    assert!(cs.ended("next"), "the next job ran to its end");
    println!(
        "faults: disk dropped off and came back (same boot): the next run waited {:?}, until the fenced command was gone; the old run said: {}",
        t.elapsed(),
        old_err.trim()
    );
}

/// A fresh loop-mounted ext4 with no periodic journal commit while the test runs (`commit=600`):
/// only what leasehold syncs reaches the disk before it is shut down. `None` (the test skips,
/// saying why, or fails under CI) without root, the tools or a loop device.
fn uncommitted_disk() -> Option<LoopExt4> {
    if support::need_root()
        || support::need_tools(&["losetup", "mkfs.ext4", "truncate", "mount", "umount", "sh"])
    {
        return None;
    }
    let disk = match LoopExt4::new() {
        Ok(d) => d,
        Err(why) => {
            support::skip(true, &format!("cannot attach a loop device here: {why}"));
            return None;
        }
    };
    let st = Command::new("mount")
        .args(["-o", "remount,commit=600"])
        .arg(&disk.mnt)
        .status()
        .expect("mount -o remount");
    assert!(st.success(), "remount with commit=600: {st}");
    Some(disk)
}

/// The first run on a disk, which records its epoch (synced) with the longest TTL, 2 s.
fn first_run(lock: &Path) {
    let st = support::lh()
        .args(["run", "--ttl", "2s"])
        .arg(lock)
        .args(["--", "true"])
        .status()
        .expect("first run");
    assert_eq!(support::code(st), 0, "the first run");
}

/// Durability per mount epoch (PROTOCOL.md §8): once a run has recorded the disk's epoch
/// (which attachment of which device, this boot, the longest TTL), later leases on it are not
/// synced. The disk drops off under such an unsynced lease (its journal is never committed:
/// the commit interval is raised first, so nothing of the lease reaches the disk by chance) and
/// comes back as a new device in the same boot: the returned disk shows an older lease, or
/// none, but its epoch record names the old device, so the next run grants nothing until the
/// longest TTL has passed since it first saw that — by then the old command, fenced by its
/// wrapper, is gone. Without the grace the next run entered beside it.
#[test]
fn a_disk_that_drops_off_under_an_unsynced_lease_holds_every_contender_for_the_longest_ttl() {
    let Some(disk) = uncommitted_disk() else {
        return;
    };
    let w = work();
    let cs = Cs::new(w.path(), "cs");
    cs.allow_fenced();
    let lock = disk.mnt.join("job.lock");
    // The first run on this disk records its epoch (synced), with the longest TTL, 2 s.
    first_run(&lock);
    let epoch = disk.mnt.join(".job.lock.leasehold-epoch");
    let recorded = fs::read_to_string(&epoch).expect("the epoch record");
    let mut old = Proc::spawn(
        support::lh()
            .args(cs.hold_args(&["--ttl", "2s"], &lock, "old"))
            .stderr(Stdio::piped()),
        "old run",
    );
    cs.wait_entered("old", Duration::from_secs(10));
    support::wait_for_child(&lock);
    let old_child = cs.job_pid("old").expect("the old job's pid");
    let old_token = support::lease(&lock).expect("the old lease")["token"]
        .as_u64()
        .expect("its token");

    disk.shut_down();
    let back = disk.reattach().expect("attach what reached the disk");
    let lock_back = back.mnt.join("job.lock");
    let on_disk = support::lease(&lock_back);
    assert!(
        on_disk
            .as_ref()
            .is_none_or(|l| l["holder"]["pid"].as_i64() != Some(i64::from(old.pid()))),
        "the old lease was not synced, so it is not on the returned disk: {on_disk:?}"
    );
    assert_eq!(
        fs::read_to_string(back.mnt.join(".job.lock.leasehold-epoch")).ok(),
        Some(recorded),
        "the returned disk keeps the epoch record, naming the device it was attached as"
    );

    let t = Instant::now();
    let mut next = Proc::spawn(
        support::lh()
            .args(cs.run_args(&["-w", "30s"], &lock_back, "next", 1))
            .stderr(Stdio::piped()),
        "next run",
    );
    let st = old.wait_timeout(Duration::from_secs(15));
    let old_err = old.stderr();
    assert_eq!(support::code(st), 74, "the old run fences: {old_err}");
    assert!(
        !support::alive(old_child),
        "the old command survived its fence"
    );
    let st = next.wait_timeout(Duration::from_secs(30));
    let err = next.stderr();
    assert_eq!(support::code(st), 0, "next run: {err}");
    let jobs = cs.verify();
    assert_eq!(jobs.len(), 2, "both jobs entered: {jobs:?}");
    assert!(cs.ended("next"), "the next job ran to its end");
    assert!(
        err.contains("back as a new device"),
        "the next run said why it waited: {err}"
    );
    // Neither the old lease nor the token it took reached the disk; the next token is still
    // above it (the floor is raised above the synced ceiling when the mismatch is first seen).
    let next_token = support::lease(&lock_back).expect("the next lease")["token"]
        .as_u64()
        .expect("its token");
    assert!(
        next_token > old_token,
        "fencing tokens grow across the returned disk: old {old_token}, next {next_token}"
    );
    println!(
        "faults: disk dropped off under an unsynced lease and came back (same boot): the next run took {:?}, the grace; the old run said: {}",
        t.elapsed(),
        old_err.trim()
    );
}

/// A holder whose lease went unsynced on the epoch record's word, and whose record is then
/// removed (a cleanup of dot files, a directory writer), makes its lease durable at its next
/// renewal (PROTOCOL.md §8): when the disk drops off after that, the returned disk shows the
/// lease, and the next run waits for the fenced command. Without that, the returned disk had
/// neither the lease nor a record, and the next run entered beside the old command.
#[test]
fn a_holder_whose_epoch_record_is_removed_syncs_its_lease_at_its_next_renewal() {
    let Some(disk) = uncommitted_disk() else {
        return;
    };
    let w = work();
    let cs = Cs::new(w.path(), "cs");
    cs.allow_fenced();
    let lock = disk.mnt.join("job.lock");
    first_run(&lock);
    let mut old = Proc::spawn(
        support::lh()
            .args(cs.hold_args(&["--ttl", "2s"], &lock, "old"))
            .stderr(Stdio::piped()),
        "old run",
    );
    cs.wait_entered("old", Duration::from_secs(10));
    support::wait_for_child(&lock);
    let seq = |l: &Path| support::lease(l).and_then(|v| v["heartbeat_seq"].as_u64());
    fs::remove_file(disk.mnt.join(".job.lock.leasehold-epoch")).expect("remove the record");
    let before = seq(&lock).expect("the old lease's heartbeat");
    // The renewal that writes `before + 1` started after the removal (we read `before` after
    // it), so it syncs — but after its write is visible. Renewals run one after another, so
    // `before + 2` on the page cache means that sync returned (CI: the disk was shut down
    // between the write and its sync, and the returned disk had the first run's lease).
    support::ensure_within(
        "two renewals after the removal",
        Duration::from_secs(5),
        || seq(&lock).is_some_and(|s| s > before + 1),
    );

    disk.shut_down();
    let back = disk.reattach().expect("attach what reached the disk");
    let lock_back = back.mnt.join("job.lock");
    let on_disk = support::lease(&lock_back);
    assert_eq!(
        on_disk.as_ref().and_then(|l| l["holder"]["pid"].as_i64()),
        Some(i64::from(old.pid())),
        "the renewal synced the lease, so it is on the returned disk: {on_disk:?}"
    );
    let mut next = Proc::spawn(
        support::lh()
            .args(cs.run_args(&["-w", "30s"], &lock_back, "next", 1))
            .stderr(Stdio::piped()),
        "next run",
    );
    let st = old.wait_timeout(Duration::from_secs(15));
    let old_err = old.stderr();
    assert_eq!(support::code(st), 74, "the old run fences: {old_err}");
    let st = next.wait_timeout(Duration::from_secs(30));
    let err = next.stderr();
    assert_eq!(support::code(st), 0, "next run: {err}");
    let jobs = cs.verify();
    assert_eq!(jobs.len(), 2, "both jobs entered: {jobs:?}");
    assert!(cs.ended("next"), "the next job ran to its end");
}
