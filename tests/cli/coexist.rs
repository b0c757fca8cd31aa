//! `leasehold run` beside util-linux flock(1) (and the flock drop-in, which by default is
//! flock(1) exactly) on the same file, both ways (PROTOCOL §10): leasehold never takes a lease
//! while another program holds a kernel lock on LOCK itself — `run -n` exits 75 naming the
//! holder's pid, a waiting `run` waits and then runs, and `status` reports the lock held by that
//! pid, not free; and flock(1) waits for a leasehold holder (`run`, `lock`'s keeper), which
//! holds an exclusive flock on LOCK's file for the whole holding — also across hand-overs
//! between leasehold waiters and when the holder is SIGKILLed — on tmpfs and ext4.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// `FLOCK FILE sh -c 'touch READY; while [ -e RELEASE ]; …'`: a kernel-lock holder that keeps
/// the lock until the test removes RELEASE; returns it once its command runs.
fn kernel_holder(flock: &[&str], file: &Path, dir: &Path) -> Proc {
    let (ready, release) = (dir.join("k.ready"), dir.join("k.release"));
    std::fs::write(&release, "").unwrap();
    let script = format!(
        "touch '{}'; while [ -e '{}' ]; do sleep 0.02; done",
        ready.display(),
        release.display()
    );
    let mut c = Command::new(flock[0]);
    c.args(&flock[1..])
        .arg(file)
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let p = Proc::spawn(c, "kernel-lock holder");
    ensure_within(
        "the kernel-lock holder's command",
        Duration::from_secs(10),
        || ready.exists(),
    );
    p
}

#[test]
fn a_run_never_takes_a_lock_file_that_flock_1_or_the_drop_in_holds() {
    if need_tools(&["flock"]) {
        return;
    }
    let bin = bin();
    let dropin = [bin.to_str().unwrap(), "flock"];
    for (who, flock) in [
        ("util-linux flock(1)", &["flock"][..]),
        ("the drop-in", &dropin[..]),
    ] {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("job.lock");
        // A lock used by leasehold before (a released record), then taken by the other program.
        lh_assert()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "true"])
            .assert()
            .success();
        let mut holder = kernel_holder(flock, &lock, d.path());
        let pid = holder.pid();
        let marker = d.path().join("ran");
        let o = lh()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(75), "{who}: run -n: {err}");
        assert!(
            err.contains(&format!("LOCK itself is locked by pid {pid} ")),
            "{who}: run -n does not name the kernel lock's holder {pid}: {err}"
        );
        assert!(!marker.exists(), "{who}: run -n ran its command");
        let st = lh().args(["status", "--json"]).arg(&lock).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(v["state"], "held", "{who}: status: {v}");
        assert!(
            v["reason"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("pid {pid} ")),
            "{who}: status does not name {pid}: {v}"
        );
        // A waiting run waits for the kernel lock, then runs.
        let mut waiter = Proc::spawn(
            lh().args(["run", "-w", "30s"])
                .arg(&lock)
                .args(["--", "touch"])
                .arg(&marker)
                .stderr(Stdio::piped()),
            "waiting run",
        );
        assert!(
            waiter
                .wait_line(Duration::from_secs(10), |l| l
                    .contains("a kernel lock on LOCK"))
                .is_some(),
            "{who}: the waiter did not say what it waits behind"
        );
        assert!(
            !marker.exists(),
            "{who}: the waiter ran beside the kernel lock's holder"
        );
        std::fs::remove_file(d.path().join("k.release")).unwrap();
        assert!(holder.wait_timeout(Duration::from_secs(10)).success());
        let st = waiter.wait_timeout(Duration::from_secs(10));
        assert!(st.success(), "{who}: the waiter: {st}: {}", waiter.stderr());
        assert!(marker.exists(), "{who}: the waiter never ran");
    }
}

/// util-linux flock(1), by the path systemd units and crontabs name it.
const FLOCK: &str = "/usr/bin/flock";

const LONG: Duration = Duration::from_secs(30);

/// The directories these tests lock in: a private tmpfs and a fresh ext4 on a loop device (both
/// need root), and the test's temp directory. Each with what keeps it mounted.
fn file_systems() -> Vec<(&'static str, PathBuf, Box<dyn std::any::Any>)> {
    let mut v: Vec<(&'static str, PathBuf, Box<dyn std::any::Any>)> = Vec::new();
    let t = tempfile::tempdir().unwrap();
    v.push(("the temp directory", t.path().to_path_buf(), Box::new(t)));
    if is_root() {
        let tmpfs = Tmpfs::new("16m");
        v.push(("tmpfs", tmpfs.dir.clone(), Box::new(tmpfs)));
        match LoopExt4::new() {
            Ok(d) => v.push(("ext4", d.mnt.clone(), Box::new(d))),
            Err(why) => assert!(!ci(), "no ext4 for the test: {why}"),
        }
    }
    v
}

/// Whether some process waits, blocked, for a kernel lock on `file`'s inode (a `->` line in
/// /proc/locks): flock(1) blocked behind a holder.
fn blocked_on(file: &Path) -> bool {
    std::fs::metadata(file).is_ok_and(|m| blocked_on_inode(&m))
}

/// [`blocked_on`] for the inode `m` describes (one that may have no name any more).
fn blocked_on_inode(m: &std::fs::Metadata) -> bool {
    let (maj, min) = (
        nix::sys::stat::major(m.dev()),
        nix::sys::stat::minor(m.dev()),
    );
    let dev = format!("{maj:02x}:{min:02x}:{}", m.ino());
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(" -> ") && l.split_whitespace().any(|f| f == dev))
}

/// `/usr/bin/flock ARGS FILE sh -c SCRIPT`, in the background.
fn flock_1(args: &[&str], file: &Path, script: &str, name: &str) -> Proc {
    let mut c = Command::new(FLOCK);
    c.args(args)
        .arg(file)
        .args(["sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Proc::spawn(c, name)
}

/// How a leasehold holder of these tests takes the lock: `leasehold run`, or a script that
/// takes it with `leasehold lock` (held by its keeper) and exits at the end.
#[derive(Clone, Copy, Debug)]
enum Holder {
    Run,
    Script,
}

/// A leasehold holder (`how`) of `lock` whose job writes its pid to `dir/holding`, creates
/// `dir/ready`, keeps
/// them until `dir/release` is removed, and removes `holding` as its last step. Returned once
/// the job runs.
fn leasehold_holder(how: Holder, lock: &Path, dir: &Path) -> Proc {
    let (ready, release, holding) = (dir.join("ready"), dir.join("release"), dir.join("holding"));
    std::fs::write(&release, "").unwrap();
    let _ = std::fs::remove_file(&ready);
    let job = format!(
        "echo $$ > '{h}'; touch '{r}'; while [ -e '{x}' ]; do sleep 0.01; done; rm '{h}'",
        h = holding.display(),
        r = ready.display(),
        x = release.display()
    );
    let mut c = match how {
        Holder::Run => {
            let mut c = lh();
            c.args(["run", "-n"])
                .arg(lock)
                .args(["--", "sh", "-c", &job]);
            c
        }
        Holder::Script => {
            let mut c = Command::new("sh");
            let body = format!("out=$(\"$LH\" lock -n \"$1\") || exit $?\neval \"$out\"\n{job}\n");
            c.arg("-c").arg(body).arg("sh").arg(lock).env("LH", bin());
            // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                c.pre_exec(|| {
                    nix::unistd::setsid().map_err(std::io::Error::from)?;
                    Ok(())
                });
            }
            c
        }
    };
    c.env_remove("LEASEHOLD_LOCK")
        .env_remove("LEASEHOLD_LEASE_ID")
        .env_remove("LEASEHOLD_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let p = Proc::spawn(c, &format!("{how:?} holder"));
    ensure_within("the leasehold holder's job", LONG, || ready.exists());
    p
}

/// While `leasehold run F` (or a script's `leasehold lock F`) holds, `/usr/bin/flock -n F`
/// and the drop-in's `flock -n F` exit 1, and `/usr/bin/flock F cmd` blocks until the
/// holder's job has ended and released, then runs — on tmpfs, ext4 and the temp directory.
/// (Before the holder flocked its file, `flock -n` exited 0 at once, beside the job.)
#[test]
fn flock_1_waits_for_a_run_or_script_holder_and_runs_once_its_job_ended() {
    if need_root() || skip(!Path::new(FLOCK).exists(), "no /usr/bin/flock") {
        return;
    }
    for (fs, base, _keep) in file_systems() {
        for how in [Holder::Run, Holder::Script] {
            let d = tempfile::tempdir_in(&base).unwrap();
            let lock = d.path().join("job.lock");
            // A lock used before (a released record), as after a migration's first runs.
            lh_assert()
                .args(["run", "-n"])
                .arg(&lock)
                .args(["--", "true"])
                .assert()
                .success();
            let mut holder = leasehold_holder(how, &lock, d.path());
            let st = Command::new(FLOCK)
                .args(["-n"])
                .arg(&lock)
                .arg("true")
                .status()
                .unwrap();
            assert_eq!(
                st.code(),
                Some(1),
                "{fs}, {how:?}: flock -n beside the holder"
            );
            let st = lh()
                .args(["flock", "-n"])
                .arg(&lock)
                .arg("true")
                .status()
                .unwrap();
            assert_eq!(st.code(), Some(1), "{fs}, {how:?}: the drop-in's flock -n");
            let (ran, overlap) = (d.path().join("flock-ran"), d.path().join("overlap"));
            let script = format!(
                "if [ -e '{h}' ]; then touch '{o}'; fi; touch '{r}'",
                h = d.path().join("holding").display(),
                o = overlap.display(),
                r = ran.display()
            );
            let mut f = flock_1(&[], &lock, &script, "flock(1)");
            ensure_within("flock(1) to block on LOCK", LONG, || blocked_on(&lock));
            assert!(
                !ran.exists(),
                "{fs}, {how:?}: flock(1) ran beside the holder"
            );
            std::fs::remove_file(d.path().join("release")).unwrap();
            let st = f.wait_timeout(LONG);
            assert!(
                st.success(),
                "{fs}, {how:?}: flock(1): {st}: {}",
                f.stderr()
            );
            assert!(
                ran.exists(),
                "{fs}, {how:?}: flock(1) never ran its command"
            );
            assert!(
                !overlap.exists(),
                "{fs}, {how:?}: flock(1) ran while the holder's job was still inside"
            );
            let st = holder.wait_timeout(LONG);
            assert!(
                st.success(),
                "{fs}, {how:?}: the holder: {st}: {}",
                holder.stderr()
            );
        }
    }
}

/// Hand-overs between leasehold waiters while util-linux flock(1) waits too, 50 rounds per
/// file system: a `run` holds; two `run`s queue behind it and a flock(1) blocks on LOCK; the
/// holder ends; while the first waiter holds, a second flock(1) blocks. Every job runs, and the
/// O_EXCL checker records no two inside at once. (Before the holder flocked its file, the
/// first flock(1) ran beside the holder at once.)
#[test]
fn hand_overs_between_run_waiters_with_flock_1_waiting_never_run_two_at_once() {
    if need_root() || skip(!Path::new(FLOCK).exists(), "no /usr/bin/flock") {
        return;
    }
    let rounds = scaled(50);
    for (fs, base, _keep) in file_systems().into_iter().skip(1) {
        let d = tempfile::tempdir_in(&base).unwrap();
        let cs = Cs::new(d.path(), "cs");
        let lock = d.path().join("job.lock");
        let queue = d.path().join(".job.lock.leasehold-queue");
        let queued = || {
            std::fs::read_dir(&queue).map_or(0, |r| {
                r.flatten()
                    .filter(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        n.starts_with("q-") && !n.ends_with(".lease")
                    })
                    .count()
            })
        };
        let flock_job = |id: &str| {
            let mut c = Command::new(FLOCK);
            c.arg(&lock)
                .args(cs.job(id, 3, "0.01"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            Proc::spawn(c, id)
        };
        let run_job = |id: &str| {
            let mut c = lh();
            c.args(["run", "-w", "60s"])
                .arg(&lock)
                .arg("--")
                .args(cs.job(id, 3, "0.01"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            Proc::spawn(c, id)
        };
        for i in 0..rounds {
            let h = format!("h{i}");
            let mut holder = Proc::spawn(
                lh().args(cs.hold_args(&["-n"], &lock, &h))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped()),
                "holder",
            );
            cs.wait_entered(&h, LONG);
            // The flock(1) blocks before the waiters queue in even rounds, after in odd ones.
            let mut procs = Vec::new();
            if i % 2 == 0 {
                procs.push(flock_job(&format!("f{i}")));
                ensure_within("flock(1) to block", LONG, || blocked_on(&lock));
            }
            // The first waiter's job is held until the test lets it end.
            let w1 = format!("w{i}");
            procs.push(Proc::spawn(
                lh().args(cs.hold_args(&["-w", "60s"], &lock, &w1))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped()),
                "first waiter",
            ));
            ensure_within("the first waiter to queue", LONG, || queued() >= 1);
            procs.push(run_job(&format!("v{i}")));
            ensure_within("the second waiter to queue", LONG, || queued() >= 2);
            if i % 2 == 1 {
                procs.push(flock_job(&format!("f{i}")));
                ensure_within("flock(1) to block", LONG, || blocked_on(&lock));
            }
            cs.release(&h);
            // While the first waiter holds, another flock(1) blocks behind it.
            cs.wait_entered(&w1, LONG);
            procs.push(flock_job(&format!("g{i}")));
            ensure_within("flock(1) to block behind the waiter", LONG, || {
                blocked_on(&lock)
            });
            cs.release(&w1);
            for mut p in procs {
                let st = p.wait_timeout(Duration::from_secs(60));
                assert!(st.success(), "{fs}, round {i}: {st}: {}", p.stderr());
            }
            let st = holder.wait_timeout(LONG);
            assert!(st.success(), "{fs}, round {i}: holder: {}", holder.stderr());
            let v = cs.violations();
            assert!(v.is_empty(), "{fs}, round {i}: {v:?}");
        }
        let all = cs.verify();
        assert_eq!(all.len(), rounds * 5, "{fs}: every job ran");
    }
}

/// A `run` holder SIGKILLed while flock(1) waits for it: the kernel drops its flock, the
/// blocked flock(1) runs, and leasehold contenders wait for flock(1) — `run -n` exits 75
/// saying so (`status` names flock(1)'s pid), a waiting `run` runs after it. (Before, flock(1) ran beside the holder.)
#[test]
fn a_sigkilled_run_holder_lets_the_blocked_flock_1_run_and_contenders_wait_for_it() {
    if need_root() || skip(!Path::new(FLOCK).exists(), "no /usr/bin/flock") {
        return;
    }
    for (fs, base, _keep) in file_systems() {
        let d = tempfile::tempdir_in(&base).unwrap();
        let lock = d.path().join("job.lock");
        let mut holder = leasehold_holder(Holder::Run, &lock, d.path());
        let (inside, release) = (
            d.path().join("flock-inside"),
            d.path().join("flock-release"),
        );
        std::fs::write(&release, "").unwrap();
        let script = format!(
            "touch '{i}'; while [ -e '{r}' ]; do sleep 0.01; done; rm '{i}'",
            i = inside.display(),
            r = release.display()
        );
        let mut f = flock_1(&[], &lock, &script, "flock(1)");
        ensure_within("flock(1) to block on LOCK", LONG, || blocked_on(&lock));
        assert!(!inside.exists(), "{fs}: flock(1) ran beside the holder");
        let job: i32 = std::fs::read_to_string(d.path().join("holding"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The wrapper alone: its job dies with it (PDEATHSIG), and is waited for here.
        kill_wrapper(&mut holder, job);
        ensure_within("flock(1) to run once the holder died", LONG, || {
            inside.exists()
        });
        let o = lh()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(75),
            "{fs}: run -n beside flock(1): {err}"
        );
        assert!(
            err.contains("a kernel lock on LOCK itself"),
            "{fs}: run -n does not say it is behind flock(1): {err}"
        );
        let st = lh().args(["status", "--json"]).arg(&lock).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(v["state"], "held", "{fs}: status: {v}");
        assert!(
            (v["reason"].as_str().unwrap_or("")).contains(&format!("pid {} ", f.pid())),
            "{fs}: status does not name flock(1)'s pid {}: {v}",
            f.pid()
        );
        let after = d.path().join("after");
        let script = format!(
            "if [ -e '{i}' ]; then exit 9; fi; touch '{a}'",
            i = inside.display(),
            a = after.display()
        );
        let mut waiter = Proc::spawn(
            lh().args(["run", "-w", "30s"])
                .arg(&lock)
                .args(["--", "sh", "-c", &script])
                .stderr(Stdio::piped()),
            "waiting run",
        );
        assert!(
            waiter
                .wait_line(LONG, |l| l.contains("a kernel lock on LOCK"))
                .is_some(),
            "{fs}: the waiter did not say what it waits behind"
        );
        assert!(!after.exists(), "{fs}: the waiter ran beside flock(1)");
        std::fs::remove_file(&release).unwrap();
        assert!(f.wait_timeout(LONG).success(), "{fs}: flock(1)");
        let st = waiter.wait_timeout(LONG);
        assert!(st.success(), "{fs}: the waiter: {st}: {}", waiter.stderr());
        assert!(after.exists(), "{fs}: the waiter never ran");
    }
}

/// A `run` wrapper SIGKILLed with its whole process group (a CI runner's cancel) while
/// flock(1) waits for it: the guardian stops what the command left running (here a process
/// that ignores SIGTERM, so it lives through the grace) and keeps the holder's lock on LOCK's
/// file until then, so flock(1) starts only once the leftover is gone. (Before, the kernel
/// dropped the lock with the wrapper, and flock(1) ran beside the leftover for the grace.)
#[test]
fn a_cancelled_run_keeps_flock_1_waiting_until_its_leftovers_are_stopped() {
    if need_root() || skip(!Path::new(FLOCK).exists(), "no /usr/bin/flock") {
        return;
    }
    for (fs, base, _keep) in file_systems() {
        let d = tempfile::tempdir_in(&base).unwrap();
        let lock = d.path().join("job.lock");
        let bg = d.path().join("bg");
        let job = format!(
            "trap '' TERM; sleep 300 & echo $! > '{b}.tmp'; mv '{b}.tmp' '{b}'; wait",
            b = bg.display()
        );
        let mut c = lh();
        c.args(["run", "-n", "--grace", "1s"])
            .arg(&lock)
            .args(["--", "sh", "-c", &job])
            .env_remove("LEASEHOLD_LOCK")
            .env_remove("LEASEHOLD_LEASE_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // `lh()` makes the wrapper its own process group's leader, as a CI job's shell is.
        let mut holder = Proc::spawn(c, "the run to cancel");
        ensure_within("the job's leftover to start", LONG, || bg.exists());
        let left: i32 = std::fs::read_to_string(&bg)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // What flock(1)'s command sees when it starts: the leftover running, or gone (no
        // /proc entry, or a zombie nobody reaped yet).
        let seen = d.path().join("seen");
        let script = format!(
            "s=$(awk '{{print $3}}' /proc/{left}/stat 2>/dev/null); \
             case \"$s\" in ''|Z|X) echo gone ;; *) echo \"running ($s)\" ;; esac > '{o}'",
            o = seen.display()
        );
        let mut f = flock_1(&[], &lock, &script, "flock(1)");
        ensure_within("flock(1) to block on LOCK", LONG, || blocked_on(&lock));
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(holder.pid()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        holder.wait_timeout(LONG);
        assert!(f.wait_timeout(LONG).success(), "{fs}: flock(1)");
        let seen = std::fs::read_to_string(&seen).unwrap();
        assert_eq!(
            seen.trim(),
            "gone",
            "{fs}: flock(1) started while the cancelled job's leftover pid {left} still ran"
        );
    }
}

/// A flock(1) that opened LOCK before a `run` renamed its lease over the file, and locks it only
/// after: kept out while the new holder's job runs (`flock -n` on that descriptor fails; a
/// blocking one waits), and let in by the holder's release — after its job, before the release
/// lets the next leasehold job in. No two jobs inside at once (O_EXCL checker). (Before, the
/// take let go of the file it replaced at once: flock(1) got it and ran beside the holder, on a
/// file no contender looks at.)
#[test]
fn a_flock_1_that_opened_lock_before_a_take_waits_for_the_new_holder_and_then_runs_alone() {
    a_program_on_the_replaced_file_runs_between_holders(OldFileLocker::Blocking);
}

/// A program that opened LOCK read-write before a take and then *polls* for its lock (`flock
/// -n` in a loop: what an NFS client's blocking flock(1) is, seen from the server's own path —
/// the server holds the file open read-write for it and never lists it as blocked) is served
/// like a blocked one: the holder's release sees the replaced file open for writing elsewhere,
/// lets go, waits until the poller has locked it and finished, and only then lets the queued
/// waiter in — never the poller beside the waiter (which the release did before, seeing nobody
/// blocked). Says so.
#[test]
fn a_program_polling_for_the_lock_of_the_file_a_take_replaced_runs_between_holders_never_beside_one()
 {
    a_program_on_the_replaced_file_runs_between_holders(OldFileLocker::Polling);
}

/// How the program that opened LOCK before a take locks that file once it was replaced.
#[derive(Clone, Copy, PartialEq)]
enum OldFileLocker {
    /// util-linux flock(1) blocking on a read-only descriptor: /proc/locks shows it blocked.
    Blocking,
    /// `flock -n` in a loop on a read-write descriptor: never blocked, the file open for
    /// writing (an NFS client's flock(1), as its server sees it).
    Polling,
}

/// LOCK free; a program opens it; `run` takes (renaming its lease over that file); the program
/// then locks the replaced file (`how`) and is kept out; a `run` waiter queues; the holder's
/// job ends. The order must be holder, program, waiter, never two inside at once (O_EXCL
/// checker), and the holder's wait must be explained.
fn a_program_on_the_replaced_file_runs_between_holders(how: OldFileLocker) {
    if need_root() || skip(!Path::new(FLOCK).exists(), "no /usr/bin/flock") {
        return;
    }
    for (fs, base, _keep) in file_systems() {
        let d = tempfile::tempdir_in(&base).unwrap();
        let cs = Cs::new(d.path(), "cs");
        let lock = d.path().join("job.lock");
        // LOCK exists and is free: a run before left its released record.
        let st = lh()
            .arg("run")
            .arg(&lock)
            .args(["--", "true"])
            .status()
            .unwrap();
        assert!(st.success(), "{fs}");
        // Opened now, locked only once the next holder has taken the lease over this file.
        let polling = how == OldFileLocker::Polling;
        let old = std::fs::OpenOptions::new()
            .read(true)
            .write(polling)
            .open(&lock)
            .unwrap();
        let probe = std::fs::File::open(&lock).unwrap();
        let old_meta = old.metadata().unwrap();
        let mut h = Proc::spawn(
            lh().args(cs.hold_args(&["-n"], &lock, "h"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            "holder",
        );
        cs.wait_entered("h", LONG);
        assert_ne!(
            std::fs::metadata(&lock).unwrap().ino(),
            old_meta.ino(),
            "{fs}: the take renamed its lease over the file"
        );
        // SAFETY: flock(2) on a descriptor we own.
        let got =
            unsafe { nix::libc::flock(probe.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB) };
        assert_ne!(
            got, 0,
            "{fs}: flock -n on the replaced file must fail while the holder runs"
        );
        drop(probe);
        // The program on that descriptor (its stdin), then a job: a blocking flock(1), or
        // `flock -n` every 20 ms, writing a line at its first refusal.
        let refused = d.path().join("refused");
        let script = if polling {
            format!(
                "until {FLOCK} -n 0; do [ -e {r} ] || echo x >{r}; sleep 0.02; done; exec \"$@\"",
                r = refused.display()
            )
        } else {
            format!("{FLOCK} 0 && exec \"$@\"")
        };
        let mut f = Command::new("sh");
        f.arg("-c")
            .arg(script)
            .arg("sh")
            .args(cs.job("f", 3, "0.01"))
            .stdin(Stdio::from(old))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut f = Proc::spawn(f, "the program on the replaced file");
        ensure_within("the program to be kept out", LONG, || {
            if polling {
                refused.exists()
            } else {
                blocked_on_inode(&old_meta)
            }
        });
        // A leasehold waiter queued behind the holder.
        let mut w = Proc::spawn(
            lh().args(["run", "-w", "60s"])
                .arg(&lock)
                .arg("--")
                .args(cs.job("w", 3, "0.01"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            "waiter",
        );
        let queue = d.path().join(".job.lock.leasehold-queue");
        ensure_within("the waiter to queue", LONG, || {
            std::fs::read_dir(&queue).is_ok_and(|r| {
                r.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("q-"))
            })
        });
        cs.release("h");
        for (p, who) in [(&mut h, "holder"), (&mut f, "program"), (&mut w, "waiter")] {
            let st = p.wait_timeout(Duration::from_secs(60));
            assert!(st.success(), "{fs}: {who}: {st}: {}", p.stderr());
        }
        let all = cs.verify();
        let order: Vec<&str> = all.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(
            order,
            ["h", "f", "w"],
            "{fs}: the program runs after the holder's job, before the next"
        );
        // The holder's release waited for it, and said so (never silently).
        let said = h.stderr();
        let waits = format!("leasehold: releasing {} waits ", lock.display());
        let (whom, end) = if polling {
            ("up to ", "to lock it or close it")
        } else {
            ("for pid ", "to finish first")
        };
        assert!(
            said.contains(&format!("{waits}{whom}")) && said.contains(end),
            "{fs}: the release's wait is not explained: {said}"
        );
    }
}

/// A `run` SIGKILLed with its group while a flock(1) waits on the file its lease replaced (one
/// that opened LOCK before the take): the guardian keeps the claim on that file too, stops
/// what the command left running (here a process that ignores SIGTERM, alive through the
/// grace), and only then lets that flock(1) run. (Without the guardian's duplicate of the
/// claim, the kernel dropped it with the wrapper and flock(1) ran beside the leftover.)
#[test]
fn a_cancelled_run_keeps_a_flock_1_on_the_file_it_replaced_waiting_until_its_leftovers_are_stopped()
{
    if need_root() || skip(!Path::new(FLOCK).exists(), "no /usr/bin/flock") {
        return;
    }
    for (fs, base, _keep) in file_systems() {
        let d = tempfile::tempdir_in(&base).unwrap();
        let lock = d.path().join("job.lock");
        let st = lh()
            .arg("run")
            .arg(&lock)
            .args(["--", "true"])
            .status()
            .unwrap();
        assert!(st.success(), "{fs}");
        let old = std::fs::File::open(&lock).unwrap();
        let old_meta = old.metadata().unwrap();
        let bg = d.path().join("bg");
        let job = format!(
            "trap '' TERM; sleep 300 & echo $! > '{b}.tmp'; mv '{b}.tmp' '{b}'; wait",
            b = bg.display()
        );
        let mut c = lh();
        c.args(["run", "-n", "--grace", "1s"])
            .arg(&lock)
            .args(["--", "sh", "-c", &job])
            .env_remove("LEASEHOLD_LOCK")
            .env_remove("LEASEHOLD_LEASE_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut holder = Proc::spawn(c, "the run to cancel");
        ensure_within("the job's leftover to start", LONG, || bg.exists());
        let left: i32 = std::fs::read_to_string(&bg)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let seen = d.path().join("seen");
        let script = format!(
            "{FLOCK} 0 || exit 9; s=$(awk '{{print $3}}' /proc/{left}/stat 2>/dev/null); \
             case \"$s\" in ''|Z|X) echo gone ;; *) echo \"running ($s)\" ;; esac > '{o}'",
            o = seen.display()
        );
        let mut f = Command::new("sh");
        f.arg("-c")
            .arg(&script)
            .stdin(Stdio::from(old))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut f = Proc::spawn(f, "flock(1) on the replaced file");
        ensure_within("flock(1) to block on the replaced file", LONG, || {
            blocked_on_inode(&old_meta)
        });
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(holder.pid()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        holder.wait_timeout(LONG);
        assert!(
            f.wait_timeout(LONG).success(),
            "{fs}: flock(1): {}",
            f.stderr()
        );
        let seen = std::fs::read_to_string(&seen).unwrap();
        assert_eq!(
            seen.trim(),
            "gone",
            "{fs}: flock(1) started while the cancelled job's leftover pid {left} still ran"
        );
        // The guardian said why flock(1) waited (its stderr is the wrapper's).
        let said = holder.stderr();
        assert!(
            said.contains("the guardian of the wrapper that held")
                && said.contains("waits for pid "),
            "{fs}: the guardian's wait is not explained: {said}"
        );
    }
}
