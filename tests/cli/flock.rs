//! The `flock` name of the binary against util-linux's own `/usr/bin/flock`: the command line
//! (bundling, prefixes, `--`, every option), exit statuses compared input by input, waits and
//! refusals in both directions on the same kernel lock, `-c`, `-o` (the descriptor is not
//! inherited), `-F` (no fork), `--fcntl` (OFD locks), the FD form in a real shell, directories
//! and a script locking itself, the kernel-only fallback where the lease cannot be kept, the
//! user's file left byte-for-byte alone, silence without `--verbose`, `leasehold status` finding
//! the lease beside the file, a lost lease fenced with 74, and no overlap between converted and
//! unconverted users.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

const REAL: &str = "/usr/bin/flock";
const LIMIT: Duration = Duration::from_secs(20);

/// A directory (mode 0755) holding `flock`, a symlink to the binary under test.
struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    /// `None` (the test skips, or fails under CI) without util-linux's flock to compare with.
    fn new() -> Option<Bench> {
        if skip(!Path::new(REAL).exists(), "no /usr/bin/flock (util-linux)") {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(bin(), dir.path().join("flock")).unwrap();
        Some(Bench { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ours_path(&self) -> PathBuf {
        self.path("flock")
    }

    /// The binary called `flock`, in its own process group, stdin closed.
    fn ours<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut c = Command::new(self.ours_path());
        c.args(args).process_group(0).stdin(Stdio::null());
        c
    }

    /// A holder of FILE's lock: `FLOCK [pre] FILE sh -c 'echo held; read x'`, released by
    /// closing its stdin; returns once it says it holds the lock.
    fn hold(&self, flock: &Path, pre: &[&str], file: &Path) -> Proc {
        let mut c = Command::new(flock);
        c.args(pre)
            .arg(file)
            .args(["sh", "-c", "echo held $$; read x || :"])
            .process_group(0)
            .stderr(Stdio::piped());
        let p = Proc::spawn_piped(c, &format!("{} holder", flock.display()));
        p.line("held", LIMIT);
        p
    }
}

/// Runs `cmd` to its end (killed and failed after [`LIMIT`]) and returns (status, stdout,
/// stderr).
#[track_caller]
fn outcome(cmd: Command) -> (i32, String, String) {
    let name = format!("{cmd:?}");
    let o = Proc::spawn_collecting(cmd, &name).finish(LIMIT);
    (o.code, o.stdout, o.stderr)
}

fn real<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut c = Command::new(REAL);
    c.args(args).process_group(0).stdin(Stdio::null());
    c
}

/// Whether process `pid` is blocked waiting for the lock on `file`, by `/proc/locks` (its `->`
/// lines: `N: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END`).
fn blocked_in_kernel(pid: i32, file: &Path) -> bool {
    let ino = fs::metadata(file).map(|m| m.ino()).unwrap_or(0);
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"->")
            && f.get(5) == Some(&pid.to_string().as_str())
            && f.get(6).and_then(|d| d.rsplit(':').next()) == Some(ino.to_string().as_str())
    })
}

/// What must not change about the user's file: bytes, mode, owner, inode, mtime.
fn fingerprint(p: &Path) -> (Vec<u8>, u32, u32, u64, i64, i64) {
    let m = fs::metadata(p).unwrap();
    let bytes = if m.is_file() {
        fs::read(p).unwrap()
    } else {
        Vec::new()
    };
    (bytes, m.mode(), m.uid(), m.ino(), m.mtime(), m.mtime_nsec())
}

/// A user's file with content, an unusual mode and an old mtime.
fn users_file(b: &Bench, name: &str) -> PathBuf {
    let f = b.path(name);
    fs::write(&f, "user data\n").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(old)
        .unwrap();
    f
}

#[test]
fn usage_help_and_version_exit_as_util_linux_flock_does() {
    let Some(b) = Bench::new() else { return };
    let cases: &[&[&str]] = &[
        &[],
        &["-n"],
        &["--bogus", "f", "true"],
        &["--n", "f", "true"],
        &["--shared=1", "f", "true"],
        &["--wait"],
        &["-w"],
        &["-z", "f", "true"],
        &["-?"],
        &["-E", "300", "f", "true"],
        &["-E", "0x10", "f", "true"],
        &["-w", "abc", "f", "true"],
        &["f", "-c"],
        &["f", "-c", "a", "b"],
        &["-oF", "f", "true"],
        &["--no-fork", "--close", "f", "true"],
        &["abc"],
        &["-c", "true", "f"],
        &["-h"],
        &["--he"],
        &["-V"],
        &["-h", "--bogus"],
    ];
    let cwd = b.path("cwd");
    fs::create_dir(&cwd).unwrap();
    for args in cases {
        let (ours, _, ours_err) = outcome({
            let mut c = b.ours(args);
            c.current_dir(&cwd);
            c
        });
        let (theirs, _, _) = outcome({
            let mut c = real(args);
            c.current_dir(&cwd);
            c
        });
        assert_eq!(
            ours, theirs,
            "flock {args:?}: ours {ours}, util-linux {theirs}"
        );
        if ours == 64 {
            assert!(
                ours_err.starts_with("flock: ") || ours_err.starts_with("Try 'flock --help'"),
                "flock {args:?}: {ours_err}"
            );
        }
    }
    assert!(
        fs::read_dir(&cwd).unwrap().next().is_none(),
        "a usage error created a file"
    );
    let (_, help, _) = outcome(b.ours(&["--help"]));
    assert!(
        help.starts_with(
            "\nUsage:\n flock [options] <file>|<directory> <command> [<argument>...]\n"
        ),
        "{help}"
    );
    for opt in [
        "--nonblock",
        "--timeout",
        "--conflict-exit-code",
        "--no-fork",
        "--fcntl",
    ] {
        assert!(help.contains(opt), "help lacks {opt}");
    }
}

#[test]
fn exit_statuses_match_util_linux_flock_and_success_is_silent() {
    let Some(b) = Bench::new() else { return };
    let f = users_file(&b, "f");
    let d = b.path("d");
    fs::create_dir(&d).unwrap();
    let (fs_, ds) = (f.to_str().unwrap(), d.to_str().unwrap());
    let missing = b.path("no-such-dir/f");
    let cases: Vec<Vec<&str>> = vec![
        vec![fs_, "true"],
        vec![fs_, "sh", "-c", "exit 3"],
        vec![fs_, "sh", "-c", "kill -9 $$"],
        vec![fs_, "-c", "exit 5"],
        vec!["-x", fs_, "--command", "exit 6"],
        vec![fs_, "no-such-command-x"],
        vec![missing.to_str().unwrap(), "true"],
        vec!["-n", "99"],
        vec!["-w", "-1", fs_, "true"],
        vec!["-s", fs_, "true"],
        vec!["-u", fs_, "true"],
        vec!["-nx", "-w", "3", fs_, "true"],
        vec!["--nb", "--timeout=2", fs_, "true"],
        vec![ds, "true"],
        vec!["-s", ds, "sh", "-c", "exit 9"],
        vec!["-F", fs_, "sh", "-c", "exit 4"],
        vec!["-F", fs_, "no-such-command-x"],
        vec!["-o", fs_, "sh", "-c", "exit 2"],
        vec![fs_, "--", "true"],
    ];
    let before = fingerprint(&f);
    for args in &cases {
        let (ours, _, ours_err) = outcome(b.ours(args));
        let (theirs, _, _) = outcome(real(args));
        assert_eq!(
            ours, theirs,
            "flock {args:?}: ours {ours}, util-linux {theirs}"
        );
        if ours == 0 || (ours < 64 && ours != 1) || ours == 137 {
            assert_eq!(ours_err, "", "flock {args:?} printed on stderr");
        } else {
            assert!(
                ours_err.starts_with("flock: "),
                "flock {args:?}: {ours_err:?}"
            );
        }
    }
    assert_eq!(fingerprint(&f), before, "the user's file changed");
    // --fcntl (util-linux 2.41; older ones lack it): an exclusive OFD lock opens for writing,
    // still without truncating.
    assert_eq!(outcome(b.ours(&["--fcntl", fs_, "true"])).0, 0);
    assert_eq!(outcome(b.ours(&["--fcntl", "-s", fs_, "true"])).0, 0);
    assert_eq!(
        fingerprint(&f),
        before,
        "the user's file changed under --fcntl"
    );
    // The lease lives beside the file (exclusive, forked), under its documented name.
    let lease = b.path(".f.leasehold-flock");
    assert_eq!(lease_state(&lease).as_deref(), Some("released"));
}

/// The lease's state field, if the lease file parses.
fn lease_state(lease: &Path) -> Option<String> {
    Some(lease_json(lease)?["lease_state"].as_str()?.to_string())
}

fn lease_json(lease: &Path) -> Option<serde_json::Value> {
    let out = lh().args(["status", "--json"]).arg(lease).output().ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

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
    // Another converted user is refused by the lease, just as silently.
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
fn command_string_uses_shell_and_close_keeps_the_descriptor_from_the_command() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let fs_ = f.to_str().unwrap();
    let (_, out, _) = outcome({
        let mut c = b.ours(&[fs_, "-c", "echo \"$0\""]);
        c.env("SHELL", "/bin/bash");
        c
    });
    assert_eq!(out, "/bin/bash\n");
    let (_, out, _) = outcome({
        let mut c = b.ours(&[fs_, "-c", "echo \"$0\""]);
        c.env_remove("SHELL");
        c
    });
    assert_eq!(out, "/bin/sh\n");
    // Which files the command has open: the lock file without -o, not with it.
    let list = "for d in /proc/$$/fd/*; do readlink \"$d\"; done; true";
    let target = fs::canonicalize(&f).unwrap();
    let shown = target.to_str().unwrap().to_string();
    let (c, inherited, _) = outcome(b.ours(&[fs_, "sh", "-c", list]));
    assert_eq!(c, 0);
    assert!(
        inherited.lines().any(|l| l == shown),
        "without -o the command holds the lock's descriptor:\n{inherited}"
    );
    let (c, closed, _) = outcome(b.ours(&["-o", fs_, "sh", "-c", list]));
    assert_eq!(c, 0);
    assert!(
        !closed.lines().any(|l| l == shown),
        "with -o the command must not hold the lock's descriptor:\n{closed}"
    );
    // The same with util-linux's flock, for comparison.
    let (_, theirs_closed, _) = outcome(real(&["-o", fs_, "sh", "-c", list]));
    assert!(!theirs_closed.lines().any(|l| l == shown));
    // No leasehold file is open in the command either way.
    for l in inherited.lines().chain(closed.lines()) {
        assert!(!l.contains(".leasehold-"), "command inherited {l}");
    }
}

#[test]
fn no_fork_makes_the_command_the_flock_process_still_holding_the_lock() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let fs_ = f.to_str().unwrap();
    let mut c = Command::new(b.ours_path());
    c.args(["-F", fs_, "sh", "-c", "echo held $$; read x || :"])
        .process_group(0);
    let mut p = Proc::spawn_piped(c, "flock -F");
    let line = p.line("held", LIMIT);
    let pid: i32 = line.parse().unwrap();
    assert_eq!(
        pid,
        p.pid(),
        "-F must exec the command in flock's own process"
    );
    assert_eq!(
        outcome(real(&["-n", fs_, "true"])).0,
        1,
        "the lock survives the exec"
    );
    p.close_stdin();
    assert_eq!(code(p.wait_timeout(LIMIT)), 0);
    assert_eq!(
        outcome(real(&["-n", fs_, "true"])).0,
        0,
        "released when the command ended"
    );
}

/// An open-file-description lock held by this test process, as `flock --fcntl` takes one.
fn ofd_lock(file: &Path, write: bool) -> Result<fs::File, nix::errno::Errno> {
    use std::os::fd::AsRawFd;
    let fh = fs::File::options()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    // SAFETY of the test: an all-zero struct flock is the whole file from offset 0, l_pid 0.
    let mut fl: nix::libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if write {
        nix::libc::F_WRLCK
    } else {
        nix::libc::F_RDLCK
    } as nix::libc::c_short;
    fl.l_whence = nix::libc::SEEK_SET as nix::libc::c_short;
    // SAFETY of the test: fl lives across the call; fh is open.
    let r = unsafe { nix::libc::fcntl(fh.as_raw_fd(), nix::libc::F_OFD_SETLK, &fl) };
    nix::errno::Errno::result(r).map(|_| fh)
}

#[test]
fn fcntl_takes_open_file_description_locks_independent_of_flock() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    fs::write(&f, "x").unwrap();
    let fs_ = f.to_str().unwrap();
    let held = ofd_lock(&f, true).expect("OFD write lock");
    assert_eq!(outcome(b.ours(&["--fcntl", "-n", fs_, "true"])).0, 1);
    assert_eq!(
        outcome(b.ours(&["--fcntl", "-s", "-n", "-E", "8", fs_, "true"])).0,
        8
    );
    assert_eq!(
        outcome(b.ours(&["-n", fs_, "true"])).0,
        0,
        "flock(2) locks are independent of OFD locks"
    );
    drop(held);
    let shared = ofd_lock(&f, false).expect("OFD read lock");
    assert_eq!(outcome(b.ours(&["--fcntl", "-s", "-n", fs_, "true"])).0, 0);
    assert_eq!(outcome(b.ours(&["--fcntl", "-n", fs_, "true"])).0, 1);
    drop(shared);
    let mut ours = b.hold(&b.ours_path(), &["--fcntl"], &f);
    assert_eq!(ofd_lock(&f, false).err(), Some(nix::errno::Errno::EAGAIN));
    ours.close_stdin();
    assert_eq!(code(ours.wait_timeout(LIMIT)), 0);
    assert!(ofd_lock(&f, true).is_ok(), "released at the end");
    assert_eq!(
        fs::read(&f).unwrap(),
        b"x",
        "an O_WRONLY open must not truncate"
    );
    // util-linux 2.41 has --fcntl too: where the installed one does, it is refused by ours.
    let help = outcome(real(&["--help"])).1;
    if help.contains("--fcntl") {
        let mut ours = b.hold(&b.ours_path(), &["--fcntl"], &f);
        assert_eq!(outcome(real(&["--fcntl", "-n", fs_, "true"])).0, 1);
        ours.close_stdin();
        ours.wait_timeout(LIMIT);
    }
}

/// The FD form's script, run by bash with `$FLOCK` as the flock under test.
const FD_SCRIPT: &str = r#"
exec 4<>"$F"
$FLOCK -n -x -E 123 4; echo "locked=$?"
$REAL -n "$F" true; echo "other=$?"
$FLOCK -u 4; echo "unlocked=$?"
$REAL -n "$F" true; echo "after=$?"
$FLOCK -s 4; echo "shared=$?"
$REAL -s -n "$F" true; echo "other-shared=$?"
$REAL -n "$F" true; echo "other-exclusive=$?"
exec 4>&-
$REAL -n "$F" true; echo "closed=$?"
( $FLOCK -n 9 || exit 1; echo "in-subshell" ) 9>"$F"; echo "subshell=$?"
$FLOCK --verbose -n 77; echo "bad-fd=$?"
"#;

#[test]
fn descriptor_form_in_a_real_shell_behaves_as_util_linux_flock() {
    let Some(b) = Bench::new() else { return };
    if need_tools(&["bash"]) {
        return;
    }
    let f = b.path("fd.lock");
    let fs_ = f.to_str().unwrap();
    let script = |flock: &Path| {
        let mut c = Command::new("bash");
        c.args(["-c", FD_SCRIPT])
            .env("F", fs_)
            .env("FLOCK", flock)
            .env("REAL", REAL)
            .stdin(Stdio::null());
        c
    };
    let (c, ours, ours_err) = outcome(script(&b.ours_path()));
    assert_eq!(c, 0);
    let (_, theirs, _) = outcome(script(Path::new(REAL)));
    assert_eq!(ours, theirs, "ours:\n{ours}\nutil-linux:\n{theirs}");
    assert!(
        ours.contains("locked=0\nother=1\nunlocked=0\nafter=0\n"),
        "{ours}"
    );
    assert!(ours.contains("shared=0\nother-shared=0\nother-exclusive=1\nclosed=0\n"));
    assert!(ours.contains("in-subshell\nsubshell=0\n"), "{ours}");
    assert!(ours.contains("bad-fd=65"), "{ours}");
    assert_eq!(ours_err, "flock: 77: Bad file descriptor\n");
    // Against a holder: the -E status, at once.
    let mut theirs = b.hold(Path::new(REAL), &[], &f);
    let (_, out, err) = outcome({
        let mut c = Command::new("bash");
        c.args([
            "-c",
            "exec 4<>\"$F\"; \"$FLOCK\" -n -x -E 123 4; echo rc=$?",
        ])
        .env("F", fs_)
        .env("FLOCK", b.ours_path())
        .stdin(Stdio::null());
        c
    });
    assert_eq!((out.as_str(), err.as_str()), ("rc=123\n", ""));
    theirs.close_stdin();
    theirs.wait_timeout(LIMIT);
}

#[test]
fn directories_and_a_script_locking_itself() {
    let Some(b) = Bench::new() else { return };
    // A directory: locked read-only, its lease beside it, the directory itself unchanged.
    let d = b.path("data");
    fs::create_dir(&d).unwrap();
    let before = fingerprint(&d);
    let mut ours = b.hold(&b.ours_path(), &[], &d);
    assert_eq!(outcome(real(&["-n", d.to_str().unwrap(), "true"])).0, 1);
    assert_eq!(
        lease_state(&b.path(".data.leasehold-flock")).as_deref(),
        Some("held")
    );
    ours.close_stdin();
    assert_eq!(code(ours.wait_timeout(LIMIT)), 0);
    assert_eq!(fingerprint(&d), before, "the directory changed");
    assert!(
        fs::read_dir(&d).unwrap().next().is_none(),
        "files appeared inside"
    );
    // flock(1)'s boilerplate: the script is its own lock file.
    let s = b.path("job.sh");
    fs::write(
        &s,
        "#!/bin/sh\n[ \"${FLOCKER}\" != \"$0\" ] && exec env FLOCKER=\"$0\" flock -en \"$0\" \"$0\" \"$@\" || :\necho running $$\nread x || :\n",
    )
    .unwrap();
    fs::set_permissions(&s, fs::Permissions::from_mode(0o755)).unwrap();
    let before = fingerprint(&s);
    let path = format!(
        "{}:{}",
        b.dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut first = Command::new(&s);
    first
        .env("PATH", &path)
        .env_remove("FLOCKER")
        .process_group(0);
    let mut first = Proc::spawn_piped(first, "first run");
    first.line("running", LIMIT);
    let (c, out, err) = outcome({
        let mut c = Command::new(&s);
        c.env("PATH", &path)
            .env_remove("FLOCKER")
            .stdin(Stdio::null());
        c
    });
    assert_eq!(
        (c, out.as_str(), err.as_str()),
        (1, "", ""),
        "a second run is refused"
    );
    assert_eq!(outcome(real(&["-n", s.to_str().unwrap(), "true"])).0, 1);
    first.close_stdin();
    assert_eq!(code(first.wait_timeout(LIMIT)), 0);
    assert_eq!(fingerprint(&s), before, "the script changed");
}

#[test]
fn read_only_places_fall_back_to_the_kernel_lock_alone() {
    let Some(b) = Bench::new() else { return };
    if need_root() || need_tools(&["mount", "umount", "setpriv"]) {
        return;
    }
    // A directory the user may not write (a root-owned 0755 directory, as /usr/local/bin for a
    // script locking itself): flock works as flock(1), no lease.
    let d = b.path("rootdir");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    let f = d.join("f");
    fs::write(&f, "").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(b.ours_path())
        .arg(&f)
        .args(["sh", "-c", "echo held; read x || :"])
        .process_group(0)
        .stderr(Stdio::piped());
    let mut nobody = Proc::spawn_piped(c, "flock as nobody");
    nobody.line("held", LIMIT);
    assert_eq!(outcome(real(&["-n", f.to_str().unwrap(), "true"])).0, 1);
    nobody.close_stdin();
    assert_eq!(code(nobody.wait_timeout(LIMIT)), 0);
    assert_eq!(nobody.stderr(), "", "the fallback is silent");
    // A read-only mount: the same, and a new name there is flock's 73.
    let ro = b.path("ro");
    fs::create_dir(&ro).unwrap();
    let g = ro.join("g");
    fs::write(&g, "keep").unwrap();
    let mount = |args: &[&str]| {
        let st = Command::new("mount")
            .args(args)
            .arg(&ro)
            .arg(&ro)
            .status()
            .unwrap();
        assert!(st.success(), "mount {args:?}");
    };
    mount(&["--bind"]);
    let _unmount = Unmount(ro.clone());
    let st = Command::new("mount")
        .args(["-o", "remount,bind,ro"])
        .arg(&ro)
        .status()
        .unwrap();
    assert!(st.success());
    let gs = g.to_str().unwrap();
    let mut ours = b.hold(&b.ours_path(), &[], &g);
    assert_eq!(outcome(real(&["-n", gs, "true"])).0, 1);
    ours.close_stdin();
    assert_eq!(code(ours.wait_timeout(LIMIT)), 0);
    let new = ro.join("new");
    let (ours, _, _) = outcome(b.ours(&[new.to_str().unwrap(), "true"]));
    let (theirs, _, _) = outcome(real(&[new.to_str().unwrap(), "true"]));
    assert_eq!((ours, theirs), (73, 73));
    let names: Vec<_> = fs::read_dir(&d)
        .unwrap()
        .chain(fs::read_dir(&ro).unwrap())
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "no lease files in read-only places: {names:?}"
    );
}

/// Unmounts a test's bind mount on drop.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
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
    let lease = b.path(".f.leasehold-flock");
    let st = lh()
        .arg("break")
        .arg("--force")
        .arg(&lease)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_eq!(code(p.wait_timeout(LIMIT)), 74);
    assert!(p.stderr().contains("flock: lease lost"), "{}", p.stderr());
    // A bad TTL is a usage error, before anything is locked.
    let (c, _, err) = outcome({
        let mut c = b.ours(&[f.to_str().unwrap(), "true"]);
        c.env("LEASEHOLD_FLOCK_TTL", "soon");
        c
    });
    assert_eq!(c, 64, "{err}");
}

#[test]
fn leasehold_flock_subcommand_is_the_same_front_end() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let (c, out, _) = outcome({
        let mut c = lh();
        c.args(["flock", "-n"]).arg(&f).args(["echo", "ran"]);
        c
    });
    assert_eq!((c, out.as_str()), (0, "ran\n"));
    let (c, _, err) = outcome({
        let mut c = lh();
        c.args(["flock", "--bogus"]);
        c
    });
    assert_eq!(c, 64);
    assert!(
        err.starts_with("leasehold flock: unrecognized option '--bogus'"),
        "{err}"
    );
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
        lease_json(&b.path(".f.leasehold-flock")).and_then(|l| l["pid"].as_i64()),
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
