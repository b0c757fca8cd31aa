//! The forms and options that change what runs and what is locked: `-c`, `-o`, `-F`, `--fcntl`,
//! the FD form in a real shell, directories and a script locking itself, and read-only places.

use super::*;

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

/// One `F_OFD_SETLK` of type `kind` (`F_WRLCK`, `F_RDLCK`, `F_UNLCK`) on the whole of `fh`.
fn ofd(fh: &fs::File, kind: i32) -> Result<(), nix::errno::Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY of the test: an all-zero struct flock is the whole file from offset 0, l_pid 0.
    let mut fl: nix::libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as nix::libc::c_short;
    fl.l_whence = nix::libc::SEEK_SET as nix::libc::c_short;
    // SAFETY of the test: fl lives across the call; fh is open.
    let r = unsafe { nix::libc::fcntl(fh.as_raw_fd(), nix::libc::F_OFD_SETLK, &fl) };
    nix::errno::Errno::result(r).map(drop)
}

/// An open-file-description lock held by this test process, as `flock --fcntl` takes one,
/// dropped with an explicit unlock: closing is not enough, since a child that another test
/// thread is forking at that moment shares the open file description until it execs.
struct OfdLock(fs::File);

impl Drop for OfdLock {
    fn drop(&mut self) {
        let _ = ofd(&self.0, nix::libc::F_UNLCK);
    }
}

fn ofd_lock(file: &Path, write: bool) -> Result<OfdLock, nix::errno::Errno> {
    let fh = fs::File::options()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let kind = if write {
        nix::libc::F_WRLCK
    } else {
        nix::libc::F_RDLCK
    };
    ofd(&fh, kind).map(|()| OfdLock(fh))
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
    // A directory: locked read-only, its lease in the runtime directory, the directory itself
    // unchanged, nothing created beside it.
    let d = b.path("data");
    fs::create_dir(&d).unwrap();
    let before = fingerprint(&d);
    let mut ours = b.hold(&b.ours_path(), &[], &d);
    assert_eq!(outcome(real(&["-n", d.to_str().unwrap(), "true"])).0, 1);
    assert_eq!(lease_state(&lease_of(&d)).as_deref(), Some("held"));
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
fn a_foreign_file_at_the_lease_name_is_left_alone_and_flock_falls_back() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    // A decoy beside the file is never consulted on a local file system.
    let decoy = b.path(".f.leasehold-flock");
    fs::write(&decoy, "not a lease\n").unwrap();
    let decoy_before = fingerprint(&decoy);
    // The lease's own name, in the runtime directory (made by a first lock).
    assert_eq!(outcome(b.ours(&[f.to_str().unwrap(), "true"])).0, 0);
    let squatter = lease_of(&f);
    let _ = fs::remove_file(&squatter);
    fs::write(&squatter, "not a lease\n").unwrap();
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }
    let _gone = Gone(squatter.clone());
    let before = fingerprint(&squatter);
    let mut ours = b.hold(&b.ours_path(), &[], &f);
    assert_eq!(outcome(real(&["-n", f.to_str().unwrap(), "true"])).0, 1);
    ours.close_stdin();
    assert_eq!(code(ours.wait_timeout(LIMIT)), 0);
    assert_eq!(ours.stderr(), "", "the fallback is silent");
    let (c, _, err) = outcome(b.ours(&["--verbose", f.to_str().unwrap(), "true"]));
    assert_eq!(c, 0);
    assert!(err.contains("kernel lock only"), "{err}");
    assert_eq!(
        fingerprint(&squatter),
        before,
        "a file at the lease's name was changed"
    );
    assert_eq!(
        fingerprint(&decoy),
        decoy_before,
        "the decoy beside was changed"
    );
}

/// The command's ignored and blocked standard signals (1–31), under `flock ARGS` started by a
/// shell that ignores SIGHUP (as `nohup` does), with SIGUSR2 blocked: `(SigIgn, SigBlk)`, as the
/// command (a shell that execs `grep`, so that no shell of its own blocks signals meanwhile)
/// inherited them.
fn dispositions(flock: &Path, args: &[&str]) -> (u64, u64) {
    let mut c = Command::new("sh");
    c.args(["-c", "trap '' HUP; exec \"$@\"", "sh"])
        .arg(flock)
        .args(args)
        .args(["sh", "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"])
        .stdin(Stdio::null());
    // SAFETY: pthread_sigmask is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            let mut usr2 = nix::sys::signal::SigSet::empty();
            usr2.add(nix::sys::signal::Signal::SIGUSR2);
            usr2.thread_block().map_err(std::io::Error::from)
        });
    }
    let (code, out, err) = outcome(c);
    assert_eq!(code, 0, "{err}");
    let field = |name: &str| {
        let hex = out
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{out}"));
        u64::from_str_radix(hex.trim(), 16).unwrap() & 0x7fff_ffff
    };
    (field("SigIgn:"), field("SigBlk:"))
}

#[test]
fn the_command_starts_with_the_signal_dispositions_it_has_under_util_linux_flock() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let fs_ = f.to_str().unwrap();
    const HUP: u64 = 1 << 0;
    const PIPE: u64 = 1 << 12;
    // The drop-in asked for its lease, and by default (a plain symlink called flock).
    let plain = b.path("plain");
    fs::create_dir(&plain).unwrap();
    std::os::unix::fs::symlink(bin(), plain.join("flock")).unwrap();
    for pre in [&[][..], &["-s"][..], &["-F"][..], &["-o"][..]] {
        let args: Vec<&str> = pre.iter().copied().chain([fs_]).collect();
        let theirs = dispositions(Path::new(REAL), &args);
        // Asked for its lease, the command starts with no signal blocked, as under `run`.
        let fenced = dispositions(&b.ours_path(), &args);
        assert_eq!(fenced.0, theirs.0, "flock {pre:?}: ignored");
        let ours = dispositions(&plain.join("flock"), &args);
        assert_eq!(ours, theirs, "flock {pre:?} by default: (ignored, blocked)");
        assert_eq!(
            ours.0 & (HUP | PIPE),
            HUP,
            "flock {pre:?}: nohup kept, SIGPIPE default"
        );
    }
}

/// Asked for its lease, the drop-in keeps it in the runtime directory on a local file system:
/// nothing beside a locked file, nothing beside a locked directory (in its parent).
#[test]
fn asked_for_its_lease_the_drop_in_creates_nothing_beside_the_file_or_directory() {
    let Some(b) = Bench::new() else { return };
    let d = b.path("work");
    fs::create_dir(&d).unwrap();
    let f = d.join("job.lock");
    let sub = d.join("sub");
    fs::create_dir(&sub).unwrap();
    assert_eq!(outcome(b.ours(&[f.to_str().unwrap(), "true"])).0, 0);
    assert_eq!(outcome(b.ours(&[sub.to_str().unwrap(), "-c", "true"])).0, 0);
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["job.lock", "sub"], "files created beside");
    assert_eq!(
        fs::read_dir(&sub).unwrap().count(),
        0,
        "files created inside"
    );
    assert_eq!(lease_state(&lease_of(&f)).as_deref(), Some("released"));
    assert_eq!(lease_state(&lease_of(&sub)).as_deref(), Some("released"));
}

/// Issue 26: whoever may write the locked file's directory cannot reach a job that asked for
/// fencing: deleting what is beside the file (before, the lease: the job was fenced, 74) or
/// planting a decoy lease there changes nothing, and `status` reports the real lease.
#[test]
fn files_deleted_or_planted_beside_the_file_never_reach_a_fenced_job() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let mut ours = b.hold(&b.ours_path(), &[], &f);
    for e in fs::read_dir(b.dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .contains(".leasehold-")
        {
            let _ = fs::remove_file(&p);
            let _ = fs::remove_dir_all(&p);
        }
    }
    // A decoy: a released record at the lease's old name beside the file.
    let decoy = b.path(".f.leasehold-flock");
    let d = tempfile::tempdir().unwrap();
    let other = d.path().join("other.lock");
    assert!(
        lh().args(["run"])
            .arg(&other)
            .args(["--", "true"])
            .status()
            .unwrap()
            .success()
    );
    fs::copy(&other, &decoy).unwrap();
    let v = lease_json(&f).expect("status of f");
    assert_eq!(v["state"], "held", "status of f reads the real lease: {v}");
    ours.close_stdin();
    assert_eq!(code(ours.wait_timeout(LIMIT)), 0, "{}", ours.stderr());
}

/// The drop-in's lease for a file lives in the runtime directory under the file's device, inode
/// and creation time: a file deleted after its holding leaves its (released) lease there, and a
/// new file that gets the same inode number must never be shown — or judged — with it.
/// (Keyed by device and inode alone, `status NEW` showed the old file's released lease.)
#[test]
fn a_lease_left_for_a_deleted_file_is_never_taken_for_a_new_file_reusing_its_inode() {
    let Some(b) = Bench::new() else { return };
    let new = b.path("new");
    // Most local file systems hand a freed inode number to the next file made nearby — unless
    // another process (a test running beside this one) makes a file in between and gets it:
    // then the whole round is tried again with another file.
    let mut left = None;
    for round in 0..10 {
        let old = b.path(&format!("old-{round}"));
        fs::write(&old, "").unwrap();
        let (rc, _, err) = outcome(b.ours(&["-n", old.to_str().unwrap(), "true"]));
        assert_eq!((rc, err.as_str()), (0, ""));
        let lease = lease_of(&old);
        assert_eq!(lease_state(&lease).as_deref(), Some("released"));
        let ino = fs::metadata(&old).unwrap().ino();
        fs::remove_file(&old).unwrap();
        let reused = (0..50).any(|_| {
            fs::write(&new, "").unwrap();
            let same = fs::metadata(&new).unwrap().ino() == ino;
            if !same {
                fs::remove_file(&new).unwrap();
            }
            same
        });
        if reused {
            left = Some(lease);
            break;
        }
    }
    let Some(left) = left else {
        skip(
            true,
            "the file system did not reuse a freed inode number in 10 rounds of 50 tries",
        );
        return;
    };
    assert_ne!(
        lease_of(&new),
        left,
        "the new file is keyed like the old one"
    );
    let fresh = b.path("fresh");
    fs::write(&fresh, "").unwrap();
    let shown = |f: &Path| {
        let mut c = Command::new(bin());
        c.args(["status", "--json"]).arg(f);
        let (rc, out, err) = outcome(c);
        let name = f.to_str().unwrap();
        (rc, out.replace(name, "FILE"), err.replace(name, "FILE"))
    };
    assert_eq!(
        shown(&new),
        shown(&fresh),
        "status of a new file reusing a deleted file's inode differs from a never-locked file's"
    );
}
