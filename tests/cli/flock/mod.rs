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

mod compat;
mod contention;
mod forms;
mod keeper;
mod parsing;

const REAL: &str = "/usr/bin/flock";
const LIMIT: Duration = Duration::from_secs(20);

/// A directory (mode 0755) holding `flock`, the binary under test asked for its lease.
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
        // The drop-in asked for its lease (`LEASEHOLD_FLOCK_FENCE=1`), which these tests are
        // about; called `flock` (argv[0]), as through the symlink. The default — flock(1)
        // exactly — is `compat.rs`'s.
        let wrapper = dir.path().join("flock");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/bash\nLEASEHOLD_FLOCK_FENCE=1 exec -a flock '{}' \"$@\"\n",
                bin().display()
            ),
        )
        .unwrap();
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
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

/// Where the drop-in, asked for its lease, keeps FILE's (which exists): in the runtime directory,
/// keyed by device and inode, on a local file system.
fn lease_of(file: &Path) -> PathBuf {
    let m = fs::metadata(file).unwrap();
    leasehold::flock_lease_path(file, (m.dev(), m.ino()), false).expect("a lease path")
}

/// The lease's state field, if the lease file parses.
fn lease_state(lease: &Path) -> Option<String> {
    Some(lease_json(lease)?["lease_state"].as_str()?.to_string())
}

fn lease_json(lease: &Path) -> Option<serde_json::Value> {
    let out = lh().args(["status", "--json"]).arg(lease).output().ok()?;
    serde_json::from_slice(&out.stdout).ok()
}
