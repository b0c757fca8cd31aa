//! Things planted at the names leasehold keeps beside LOCK: a hard link to another file, a
//! symlink, a directory, a FIFO or a socket at the mutex name or at the queue directory's name.
//! leasehold never writes, locks, removes or follows them: it refuses with exit 65 naming the
//! file, and the planted target is unchanged (bytes, mode, owner, modification time, links).
//! Also: a process sitting on the mutex is named (pid and user) on the wait line within about a
//! second, `-w` still bounds the wait, and temp files are made under unpredictable names and
//! never left behind. These run as any user (the planter owns the victim file here; the
//! multi-user suite plants other users' files as root).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{Proc, ensure_within, lh};

/// Everything about a file that a write, chmod, truncate, link or unlink would change.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    bytes: Vec<u8>,
    mode: u32,
    uid: u32,
    nlink: u64,
    mtime: (i64, i64),
}

fn snapshot(p: &Path) -> Snapshot {
    let m = fs::symlink_metadata(p).expect("stat the planted target");
    Snapshot {
        bytes: if m.is_file() {
            fs::read(p).expect("read the planted target")
        } else {
            Vec::new()
        },
        mode: m.mode(),
        uid: m.uid(),
        nlink: m.nlink(),
        mtime: (m.mtime(), m.mtime_nsec()),
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `leasehold ARGS` with a bound on its run time; its exit code and stderr.
fn run(args: &[&str], lock: &Path, tail: &[&str]) -> (i32, String) {
    let mut k = Proc::spawn(
        lh().args(args)
            .arg(lock)
            .args(tail)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "leasehold",
    );
    let st = k.wait_timeout(Duration::from_secs(20));
    (st.code().unwrap_or(-1), k.stderr())
}

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    lock: PathBuf,
    victim: PathBuf,
}

fn setup() -> Setup {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = fs::canonicalize(d.path()).expect("canonical");
    let victim_dir = dir.join("private");
    fs::create_dir(&victim_dir).expect("mkdir");
    let victim = victim_dir.join("victim.conf");
    fs::write(&victim, b"precious = true\n").expect("write victim");
    Setup {
        lock: dir.join("job.lock"),
        victim,
        dir,
        _dir: d,
    }
}

#[test]
fn a_hard_link_planted_at_the_mutex_name_is_refused_and_its_target_untouched() {
    let s = setup();
    let mutex = s.dir.join(".job.lock.leasehold-mutex");
    fs::hard_link(&s.victim, &mutex).expect("plant the link");
    let before = snapshot(&s.victim);
    // The command, if it ran, would leave `ran` behind.
    let ran = s.dir.join("ran");
    let touch = ["--", "touch", ran.to_str().expect("utf-8 path")];
    for (args, tail) in [
        (&["run", "-n"][..], &touch[..]),
        (&["run", "-w", "2"][..], &touch[..]),
        (&["break", "--force"][..], &[][..]),
    ] {
        let (code, err) = run(args, &s.lock, tail);
        assert_eq!(code, 65, "{args:?}: {err}");
        assert!(
            err.contains("leasehold-mutex") && err.contains("hard link"),
            "{err}"
        );
    }
    assert_eq!(snapshot(&s.victim), before, "the planted target changed");
    assert!(!ran.exists(), "a refused run ran its command");
}

#[test]
fn a_directory_fifo_or_socket_at_the_mutex_name_is_refused_with_65_naming_it() {
    for kind in ["directory", "FIFO", "socket"] {
        let s = setup();
        let mutex = s.dir.join(".job.lock.leasehold-mutex");
        let _listener;
        match kind {
            "directory" => fs::create_dir(&mutex).expect("mkdir"),
            "FIFO" => nix::unistd::mkfifo(&mutex, nix::sys::stat::Mode::from_bits_truncate(0o644))
                .expect("mkfifo"),
            _ => _listener = std::os::unix::net::UnixListener::bind(&mutex).expect("bind"),
        }
        let before = snapshot(&mutex);
        let (code, err) = run(&["run", "-w", "2"], &s.lock, &["--", "true"]);
        assert_eq!(code, 65, "{kind}: {err}");
        assert!(
            err.contains(".job.lock.leasehold-mutex") && err.contains(kind),
            "{kind}: {err}"
        );
        assert_eq!(snapshot(&mutex), before, "{kind} changed");
    }
}

#[test]
fn a_symlink_at_the_queue_directory_name_is_never_followed() {
    let s = setup();
    // Another directory holding ticket-like files and others.
    let elsewhere = s.dir.join("elsewhere");
    fs::create_dir(&elsewhere).expect("mkdir");
    for n in [
        "q-00000000000000000001",
        "q-00000000000000000001.lease",
        "q-00000000000000000002",
        "notes.txt",
    ] {
        fs::write(elsewhere.join(n), n).expect("write");
    }
    // A holder, so that a blocking contender needs the queue.
    let mut holder = crate::support::Holder::start(&s.lock, &["--ttl", "5s"]);
    symlink(&elsewhere, s.dir.join(".job.lock.leasehold-queue")).expect("plant the symlink");
    let listing = names(&elsewhere);
    let snaps: Vec<Snapshot> = listing
        .iter()
        .map(|n| snapshot(&elsewhere.join(n)))
        .collect();
    let (code, err) = run(&["run", "-w", "3"], &s.lock, &["--", "true"]);
    assert_eq!(
        code, 65,
        "a blocking run must refuse the planted queue: {err}"
    );
    assert!(err.contains("leasehold-queue"), "{err}");
    let (code, err) = run(&["run", "-n"], &s.lock, &["--", "true"]);
    assert!(code == 65 || code == 75, "-n: {code}: {err}");
    let (code, err) = run(&["status"], &s.lock, &[]);
    assert_eq!(code, 0, "status reads the lock all the same: {err}");
    assert!(holder.finish().success());
    assert_eq!(
        names(&elsewhere),
        listing,
        "files appeared or vanished elsewhere"
    );
    let after: Vec<Snapshot> = listing
        .iter()
        .map(|n| snapshot(&elsewhere.join(n)))
        .collect();
    assert_eq!(after, snaps, "files elsewhere changed");
}

#[test]
fn a_process_sitting_on_the_mutex_is_named_within_a_second_and_w_bounds_the_wait() {
    let s = setup();
    // Create the helper files, then sit on the mutex with util-linux flock(1).
    let (code, err) = run(&["run", "-n"], &s.lock, &["--", "true"]);
    assert_eq!(code, 0, "{err}");
    let mutex = s.dir.join(".job.lock.leasehold-mutex");
    let ready = s.dir.join("sitting");
    let sitter = Proc::spawn(
        std::process::Command::new("flock")
            .arg(&mutex)
            .arg("sh")
            .arg("-c")
            .arg(format!("touch '{}'; exec sleep 60", ready.display()))
            .stdin(Stdio::null()),
        "flock(1) sitting on the mutex",
    );
    ensure_within("flock to hold the mutex", Duration::from_secs(10), || {
        ready.exists()
    });
    // Without -w: the wait line comes within about a second and names the sitter.
    let mut waiter = Proc::spawn(
        lh().args(["run"])
            .arg(&s.lock)
            .args(["--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "waiter",
    );
    let started = Instant::now();
    let err = waiter.take_stderr().expect("stderr");
    let mut line = String::new();
    BufReader::new(err)
        .read_line(&mut line)
        .expect("read the wait line");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "wait line came after {took:?}"
    );
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_default();
    // flock(1) forks sh, which execs sleep: the lock is held by the flock process.
    assert!(
        line.contains(&format!("pid {}", sitter.pid())) && line.contains(&user),
        "the wait line must name the process and user on the mutex: {line:?}"
    );
    assert!(line.contains("mutex"), "{line:?}");
    drop(waiter);
    // With -w: gives up after about the wait, naming the sitter too.
    let t = Instant::now();
    let (code, err) = run(&["run", "-w", "1"], &s.lock, &["--", "true"]);
    assert_eq!(code, 75, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "-w 1 took {:?}",
        t.elapsed()
    );
    assert!(err.contains(&format!("pid {}", sitter.pid())), "{err}");
    drop(sitter);
}

#[test]
fn temp_files_are_never_left_behind_and_a_planted_temp_name_is_not_used() {
    let s = setup();
    // The temp name, planted as a link to the victim: never opened, never removed; leasehold
    // writes through a randomly named temp file instead.
    fs::hard_link(&s.victim, s.dir.join(".job.lock.leasehold-tmp")).expect("plant");
    let before = snapshot(&s.victim);
    for _ in 0..3 {
        let (code, err) = run(&["run", "-n"], &s.lock, &["--", "true"]);
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(snapshot(&s.victim), before);
    assert!(s.dir.join(".job.lock.leasehold-tmp").exists());
    let left: Vec<String> = names(&s.dir)
        .into_iter()
        .filter(|n| n.starts_with(".job.lock.leasehold-tmp-"))
        .collect();
    assert!(left.is_empty(), "temp files left behind: {left:?}");
}

#[test]
fn a_leftover_temp_file_of_a_crashed_writer_is_removed_when_its_stale_lease_is_taken_over() {
    let s = setup();
    let (code, err) = run(&["run", "-n"], &s.lock, &["--", "true"]);
    assert_eq!(code, 0, "{err}");
    // What a writer killed between creating and renaming its temp file leaves, with a lease
    // whose holder is gone.
    let leftover = s.dir.join(".job.lock.leasehold-tmp-0123456789abcdef");
    fs::write(&leftover, b"half a lease").expect("write");
    let fixed = s.dir.join(".job.lock.leasehold-tmp");
    fs::write(&fixed, b"another half").expect("write");
    // A held lease of this host whose holder is gone (our PID with another start time).
    let dead = crate::support::crafted(
        std::process::id() as i32,
        1,
        &leasehold::Identity::current(),
        Duration::from_secs(30),
        7,
    );
    fs::write(&s.lock, dead.to_bytes()).expect("forge");
    // Also an innocent file with a similar name but another shape is left alone.
    let innocent = s.dir.join(".job.lock.leasehold-tmp-notes");
    fs::write(&innocent, b"mine").expect("write");
    let (code, err) = run(&["run", "-n"], &s.lock, &["--", "true"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !leftover.exists(),
        "the crashed writer's temp file is still there"
    );
    assert!(!fixed.exists(), "the recycled temp name is still there");
    assert!(innocent.exists());
}
