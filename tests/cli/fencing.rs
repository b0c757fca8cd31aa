//! Fencing through the real binary: SIGKILL of the wrapper takes its command down (PDEATHSIG)
//! and the next run stops the grandchild it left before its own command starts; a stolen lease
//! (`break --force`) fences a command with grandchildren and none survive (exit 74); a renewal
//! failure (the lock's tmpfs remounted read-only, or lazily unmounted) fences the command before
//! the TTL elapses; a SIGSTOPped wrapper is taken over after about a TTL with its command dead
//! first, and exits 74 once resumed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// `sh -c 'sleep 100 & echo $! > GC; sleep 100'`-style command: a child shell with a grandchild
/// in its process group; returns the script and the file the grandchild's pid is written to.
fn job_with_grandchild(dir: &Path, name: &str) -> (String, PathBuf) {
    let gc = dir.join(format!("{name}.gc"));
    let script = format!(
        "sleep 100 & echo $! > '{gc}.tmp' && mv '{gc}.tmp' '{gc}'; sleep 100",
        gc = gc.display()
    );
    (script, gc)
}

/// A job as the tests run it: `leasehold run --ttl TTL LOCK -c` a command with a grandchild
/// (see [`job_with_grandchild`]), scratch files in `dir`; once the lease names the command,
/// returns the wrapper, the command's pid, its process group and the grandchild's pid.
fn start_job(
    dir: &Path,
    name: &str,
    lock: &Path,
    ttl: &str,
    stderr: Stdio,
    label: &'static str,
) -> (Proc, i32, i32, i32) {
    let (script, gc) = job_with_grandchild(dir, name);
    let w = Proc::spawn(
        lh().args(["run", "--ttl", ttl])
            .arg(lock)
            .arg("-c")
            .arg(&script)
            .stderr(stderr),
        label,
    );
    let (_, child, pgid) = wait_for_child(lock);
    let grandchild = read_pid(&gc);
    (w, child, pgid, grandchild)
}

#[track_caller]
fn read_pid(f: &Path) -> i32 {
    ensure_within("the pid file", Duration::from_secs(10), || f.exists());
    std::fs::read_to_string(f)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid")
}

/// Waits (10 s at most) for wrapper `w` to exit 74 saying it fenced its command, and asserts
/// that nothing is left of the command's process group `pgid`. Returns its stderr.
#[track_caller]
fn assert_fenced(w: &mut Proc, pgid: i32) -> String {
    let st = w.wait_timeout(Duration::from_secs(10));
    let err = w.stderr();
    assert_eq!(st.code(), Some(74), "{err}");
    assert!(err.contains("fenced"), "{err}");
    assert!(
        group(pgid).is_empty(),
        "left of the fenced job: {:?}",
        group(pgid)
    );
    err
}

#[test]
fn kill_9_of_the_wrapper_kills_the_command_and_the_next_run_stops_leftovers_first() {
    let d = tmp();
    let lock = d.path().join("k9.lock");
    let (mut w1, child, pgid, grandchild) =
        start_job(d.path(), "k9", &lock, "30s", Stdio::null(), "first wrapper");
    assert!(group(pgid).contains(&grandchild));
    // PDEATHSIG: the command dies with its wrapper; the grandchild is left behind — its
    // guardian killed first, as by the OOM killer (the guardian would stop it too).
    kill_guardian(w1.pid());
    kill_wrapper(&mut w1, child);
    assert!(alive(grandchild), "the grandchild outlives PDEATHSIG");
    // The next run's command starts only once the old job's group is dead.
    let out = lh_assert()
        .args(["run", "-w", "10s"])
        .arg(&lock)
        .args([
            "-c",
            &format!(
                "s=$(awk '{{print $3}}' /proc/{grandchild}/stat 2>/dev/null); [ -z \"$s\" ] || [ \"$s\" = Z ] || {{ echo alive:$s; exit 9; }}; echo clean"
            ),
        ])
        .assert()
        .success();
    assert_eq!(
        String::from_utf8_lossy(&out.get_output().stdout).trim(),
        "clean"
    );
    assert!(!alive(grandchild));
    assert!(group(pgid).is_empty());
}

#[test]
fn a_stolen_lease_fences_the_command_and_all_its_grandchildren() {
    let d = tmp();
    let lock = d.path().join("steal.lock");
    let (mut w, child, pgid, grandchild) =
        start_job(d.path(), "steal", &lock, "1s", Stdio::piped(), "wrapper");
    let members = group(pgid);
    assert!(
        members.len() >= 2,
        "the command and its grandchild: {members:?}"
    );
    lh_assert()
        .args(["break", "--force"])
        .arg(&lock)
        .assert()
        .success()
        .stderr_has("revoked held lease");
    let t = Instant::now();
    let err = assert_fenced(&mut w, pgid);
    // Noticed at the next renewal (TTL/3), then SIGTERM: well within a TTL.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(err.contains("leasehold: fenced "), "{err}");
    assert!(
        err.contains(&format!("lease on {} lost", lock.display())),
        "{err}"
    );
    // Says what happened to the lease, and who did it, in words that read as a sentence.
    assert!(err.contains(": lease broken: revoked by "), "{err}");
    assert!(!err.contains("holds our lease"), "{err}");
    for p in members.iter().chain([&child, &grandchild]) {
        assert!(!alive(*p), "pid {p} survived the fence");
    }
}

#[test]
fn a_command_ignoring_sigterm_is_sigkilled_after_the_grace() {
    let d = tmp();
    let lock = d.path().join("grace.lock");
    let ready = d.path().join("ready");
    let script = format!(
        "trap '' TERM; (trap '' TERM; sleep 100) & touch '{}'; while :; do sleep 0.02; done",
        ready.display()
    );
    let mut w = Proc::spawn(
        lh().args(["run", "--ttl", "2s", "--grace", "300ms"])
            .arg(&lock)
            .arg("-c")
            .arg(&script)
            .stderr(Stdio::piped()),
        "wrapper",
    );
    let (_, _, pgid) = wait_for_child(&lock);
    ensure_within("the command to start", Duration::from_secs(10), || {
        ready.exists()
    });
    let members = group(pgid);
    let t = Instant::now();
    lh_assert()
        .args(["break", "--force", "-q"])
        .arg(&lock)
        .assert()
        .success();
    let st = w.wait_timeout(Duration::from_secs(10));
    assert_eq!(st.code(), Some(74), "{}", w.stderr());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "SIGKILL before the grace: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    for p in members {
        assert!(!alive(p), "pid {p} survived");
    }
}

/// A small tmpfs mounted on a fresh directory, unmounted (lazily) on drop.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount() -> Option<Tmpfs> {
        let parent = tmp();
        let dir = parent.path().join("mnt");
        std::fs::create_dir(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs {
            dir,
            _parent: parent,
        })
    }

    /// Makes the storage fail: remount read-only, or (where the kernel refuses that while a
    /// file is open for writing) unmount lazily. Returns which it did.
    fn fail(&self, lazy: bool) -> &'static str {
        for _ in 0..if lazy { 0 } else { 20 } {
            let ro = Command::new("mount")
                .args(["-o", "remount,ro"])
                .arg(&self.dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ro {
                return "remount,ro";
            }
        }
        let lazy = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(lazy, "neither remount,ro nor umount -l worked");
        "umount -l"
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn a_renewal_failure_fences_the_command_before_the_ttl_elapses() {
    if need_root() {
        return;
    }
    renewal_failure(false);
}

#[test]
fn a_vanished_lock_directory_fences_the_command_before_the_ttl_elapses() {
    if need_root() {
        return;
    }
    renewal_failure(true);
}

fn renewal_failure(lazy: bool) {
    let Some(fs) = Tmpfs::mount() else {
        skip(true, "cannot mount a tmpfs here");
        return;
    };
    let ttl = Duration::from_secs(1);
    let lock = fs.dir.join("ro.lock");
    let side = tmp();
    let (mut w, child, pgid, grandchild) =
        start_job(side.path(), "ro", &lock, "1s", Stdio::piped(), "wrapper");
    let members = group(pgid);
    // The last heartbeat that can have succeeded is before this instant.
    let failed_at = Instant::now();
    let how = fs.fail(lazy);
    let st = w.wait_timeout(Duration::from_secs(10));
    let fenced_after = failed_at.elapsed();
    assert_eq!(st.code(), Some(74), "{how}: {}", w.stderr());
    assert!(
        fenced_after < ttl,
        "{how}: command fenced {fenced_after:?} after the storage failed; TTL is {ttl:?}"
    );
    let err = w.stderr();
    assert!(err.contains("fenced"), "{err}");
    for p in members.iter().chain([&child, &grandchild]) {
        assert!(!alive(*p), "pid {p} survived the fence ({how})");
    }
    eprintln!("renewal failure by {how}: fenced {fenced_after:?} after it");
}

#[test]
fn a_sigstopped_wrapper_is_taken_over_after_a_ttl_and_exits_74_when_resumed() {
    let d = tmp();
    let lock = d.path().join("frozen.lock");
    let ttl = Duration::from_millis(800);
    let (mut w1, child, pgid, grandchild) = start_job(
        d.path(),
        "frozen",
        &lock,
        "800ms",
        Stdio::piped(),
        "frozen wrapper",
    );
    let members = group(pgid);
    w1.signal(Signal::SIGSTOP);
    ensure_within("the wrapper to stop", Duration::from_secs(5), || {
        proc_state(w1.pid()) == Some('T')
    });
    let stopped_at = Instant::now();
    // The contender's command checks that every process of the old job is dead (gone or a
    // zombie) before it does anything.
    let pids: Vec<String> = members
        .iter()
        .chain([&child, &grandchild])
        .map(|p| p.to_string())
        .collect();
    let check = format!(
        "for p in {}; do s=$(awk '{{print $3}}' /proc/$p/stat 2>/dev/null); [ -z \"$s\" ] || [ \"$s\" = Z ] || {{ echo alive:$p:$s; exit 9; }}; done; echo clean",
        pids.join(" ")
    );
    let out = lh_run(&["-w", "10s", "--ttl", "800ms"], &lock, &["-c", &check])
        .success()
        .stderr_has("broke hung lease");
    let took = stopped_at.elapsed();
    assert_eq!(
        String::from_utf8_lossy(&out.get_output().stdout).trim(),
        "clean"
    );
    // Taken over after a TTL of silence, not before: the contender started after the stop,
    // and judges the wrapper hung only once it has seen its heartbeat unchanged for a TTL.
    assert!(took >= ttl, "taken over after only {took:?} (TTL {ttl:?})");
    assert!(took < ttl * 5, "taken over after {took:?}");
    // Resumed, the frozen wrapper finds its lease gone and exits 74.
    w1.signal(Signal::SIGCONT);
    assert_fenced(&mut w1, pgid);
}

#[test]
fn processes_left_behind_by_a_finished_command_are_stopped_before_release() {
    let d = tmp();
    let lock = d.path().join("left.lock");
    let gc = d.path().join("left.gc");
    let script = format!(
        "sleep 100 & echo $! > '{gc}.tmp' && mv '{gc}.tmp' '{gc}'; exit 3",
        gc = gc.display()
    );
    let out = lh()
        .args(["run", "--ttl", "2s", "--grace", "200ms"])
        .arg(&lock)
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run");
    // The command's own status is kept; the background sleep is gone before the release.
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("left 1 process(es) running"), "{err}");
    let grandchild = read_pid(&gc);
    assert!(
        !alive(grandchild),
        "the leftover sleep {grandchild} survived"
    );
    let l = lease(&lock).expect("lease");
    assert_eq!(l["state"], "released");
}

/// Runs `leasehold run --ttl 2s --grace 200ms LOCK -c SCRIPT` to its end in `d`.
fn run_to_end(d: &Path, name: &str, script: &str) -> (std::process::Output, PathBuf) {
    let lock = d.join(format!("{name}.lock"));
    let out = lh()
        .args(["run", "--ttl", "2s", "--grace", "200ms"])
        .arg(&lock)
        .arg("-c")
        .arg(script)
        .output()
        .expect("run");
    (out, lock)
}

#[test]
fn a_leftover_whose_parent_still_runs_is_stopped_with_its_parent_before_release() {
    // The sleep is not an orphan (its subshell waits for it), so it never comes back to the
    // wrapper as a child of its own: it is found in the command's group all the same.
    let d = tmp();
    let gc = d.path().join("nested.gc");
    let script = format!(
        "(sleep 100 & echo $! > '{gc}.tmp' && mv '{gc}.tmp' '{gc}'; wait) & \
         while [ ! -e '{gc}' ]; do sleep 0.01; done; exit 0",
        gc = gc.display()
    );
    let (out, lock) = run_to_end(d.path(), "nested", &script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("left 2 process(es) running"), "{err}");
    let grandchild = read_pid(&gc);
    assert!(!alive(grandchild), "the nested sleep {grandchild} survived");
    assert_eq!(lease(&lock).expect("lease")["state"], "released");
}

#[test]
fn a_leftover_ignoring_sigterm_is_sigkilled_after_the_grace_before_release() {
    let d = tmp();
    let gc = d.path().join("stubborn.gc");
    let script = format!(
        "(trap '' TERM; exec sleep 100) & echo $! > '{gc}.tmp' && mv '{gc}.tmp' '{gc}'; exit 5",
        gc = gc.display()
    );
    let (out, lock) = run_to_end(d.path(), "stubborn", &script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("left 1 process(es) running"), "{err}");
    let leftover = read_pid(&gc);
    assert!(
        !alive(leftover),
        "the sleep ignoring SIGTERM {leftover} survived"
    );
    assert_eq!(lease(&lock).expect("lease")["state"], "released");
}

#[test]
fn a_process_that_left_the_commands_group_is_neither_stopped_nor_reported() {
    // `setsid` makes a new session and group: not the job's any more (as before the wrapper
    // became a child subreaper, to which this orphan now comes back). Its output goes elsewhere,
    // or collecting the wrapper's output would wait for it.
    let d = tmp();
    let pidf = d.path().join("daemon.pid");
    // The shell exits only once the daemon has its own group (`setsid` runs in the background
    // child: exiting before it did would leave it, rightly, in the job's group).
    let script = format!(
        "setsid sleep 60 </dev/null >/dev/null 2>&1 & d=$!; \
         until [ ! -e /proc/$d ] || [ \"$(cut -d' ' -f5 /proc/$d/stat)\" = \"$d\" ]; do :; done; \
         echo $d > '{p}.tmp' && mv '{p}.tmp' '{p}'; exit 0",
        p = pidf.display()
    );
    let (out, lock) = run_to_end(d.path(), "daemon", &script);
    let daemon = read_pid(&pidf);
    let still = alive(daemon);
    // The test started it: stop it whatever happened.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), Signal::SIGKILL);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("left"), "{err}");
    assert!(still, "the process {daemon} in its own session was stopped");
    assert_eq!(lease(&lock).expect("lease")["state"], "released");
}
