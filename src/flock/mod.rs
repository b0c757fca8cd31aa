//! The `flock` front end: util-linux flock(1)'s command line and behaviour, on leasehold.
//!
//! Invoked as `flock` (the binary's file name, e.g. through `ln -s leasehold flock`) or as
//! `leasehold flock ARGS...`. It takes the same kernel lock flock(1) takes on the named file, so
//! unconverted flock(1) users, `lslocks` and udev see and respect it. Only when asked
//! (`LEASEHOLD_FLOCK_FENCE=1`, [`FENCE_VAR`]) and for a lock around a command, also a heartbeat
//! lease ([`leasehold::flock_lease_path`]: in the runtime directory on a local file system,
//! beside the file on NFS; shared for `-s`), taken first, so
//! converted users queue in FIFO order, `leasehold status FILE` explains who holds it, and a
//! lost lease fences the command (exit 74).
//!
//! The FD form (`exec 9>F; flock -n 9`) and `-F` hold their lease through a detached keeper
//! (script mode's, `crate::script`): bound to the shell and its descriptor for the FD form
//! (released when no process of the shell's job holds the kernel lock any more), to flock's own
//! pid — the exec'd command's — for `-F`.
//!
//! Owns: the entry point, flock's messages (prefixed with the program name; the lock's own
//! messages only with `--verbose`) and exit statuses. `args` parses, `lock` holds the kernel
//! lock, `run` runs the file form, `descriptor` the FD form. Must never: write, truncate,
//! chmod, rename or delete the named file; print anything flock(1) would not print without
//! `--verbose`.
//!
//! By default nothing is leased: the kernel lock only, exactly as flock(1) (no helper file, no
//! fencing, the command in the caller's process group). The lease is taken only when
//! [`FENCE_VAR`] asks for it; even then some locks are kernel-only, each marked [`KernelOnly`]:
//! `-u`, `--fcntl`, and whatever cannot keep a lease.

pub mod args;
pub(crate) mod descriptor;
mod lock;
mod run;

use std::ffi::OsString;
use std::io::Write as _;
use std::time::Instant;

use args::{Parsed, Target};
/// flock's `--help` and `--version` texts under a given program name (for a `flock` man page).
pub use args::{help_text, version_text};

/// Why a lock is taken as flock(1) takes it, kernel lock only, without a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelOnly {
    /// `-u`: dropping a lock takes no lease.
    Unlock,
    /// The FD form, when the process that ran flock (the shell) does not hold the descriptor
    /// (it exec'd flock, or is another user's): no process to bind a lease to.
    Descriptor,
    /// The FD form, when the shell already holds a lease on the file through flock (a second
    /// lock call: a conversion, or another of its descriptors).
    Relock,
    /// The path has no directory beside it to hold a lease (`/`, `.`, `..`).
    NoPlaceBeside,
    /// Not a regular file or a directory (a device, FIFO or socket): its directory belongs to
    /// the system (`/dev`), and its lock protocol is the kernel lock alone.
    NotAFile,
    /// The lease could not be taken for a reason other than a holder (no write access to the
    /// directory, a read-only or full file system, an untrusted file at its name...).
    LeaseUnavailable,
    /// The default: [`FENCE_VAR`] does not ask for a lease, so flock does exactly what
    /// flock(1) does (PROTOCOL.md §12).
    NotAsked,
    /// `--fcntl`: its lock is independent of the flock(2) locks on the same file (util-linux
    /// 2.41), so it shares no lease with them.
    Fcntl,
}

impl KernelOnly {
    /// Why, in words, for `--verbose`.
    pub fn why(self) -> &'static str {
        match self {
            KernelOnly::Unlock => "unlocking takes no lease",
            KernelOnly::Descriptor => "the calling process does not hold the descriptor",
            KernelOnly::Relock => "the calling process already holds the lease",
            KernelOnly::NoPlaceBeside => "the path has no directory to keep a lease in",
            KernelOnly::NotAFile => "not a regular file or directory",
            KernelOnly::LeaseUnavailable => "the lease cannot be taken",
            KernelOnly::NotAsked => "no lease asked for",
            KernelOnly::Fcntl => "--fcntl locks are independent of flock locks",
        }
    }
}

/// The environment variable that asks for a lease (and so for fencing) around the kernel lock:
/// `LEASEHOLD_FLOCK_FENCE=1`. Unset (or anything but `1`), flock does exactly what util-linux
/// flock(1) does: the kernel lock decides, the command runs in the caller's process group, what
/// it leaves behind keeps running, nothing is ever killed and no file is created but the one
/// named (PROTOCOL.md §12).
pub const FENCE_VAR: &str = "LEASEHOLD_FLOCK_FENCE";

/// Whether [`FENCE_VAR`] asks for a lease.
pub(crate) fn fence_asked() -> bool {
    std::env::var_os(FENCE_VAR).is_some_and(|v| v == "1")
}

/// `--verbose`'s "kernel lock only: WHY", said only when a lease was asked for (flock(1) has
/// no such line, so the default never prints it).
fn say_kernel_only(prog: &str, o: &args::Options, why: Option<KernelOnly>) {
    if let (Some(why), true, true) = (why, o.verbose, fence_asked()) {
        warn(prog, &format!("kernel lock only: {}", why.why()));
    }
}

/// Runs the flock front end with `args` (without the program name) under the name `prog`
/// (used in messages) and returns the exit status.
pub fn main(prog: &str, args: &[OsString]) -> i32 {
    match args::parse(args) {
        Parsed::Help => {
            print_out(&args::help_text(prog));
            0
        }
        Parsed::Version => {
            print_out(&args::version_text(prog));
            0
        }
        Parsed::Usage(lines) => {
            for l in lines {
                if args::is_try_help(&l) {
                    raw_err(&format!("Try '{prog} --help' for more information."));
                } else {
                    warn(prog, &l);
                }
            }
            64
        }
        Parsed::BadTimer => {
            warn(prog, "cannot set up timer: Invalid argument");
            71
        }
        Parsed::Run(o, Target::Fd(fd)) => descriptor::descriptor(prog, &o, fd),
        Parsed::Run(o, Target::File { path, command }) => run::file(prog, &o, &path, &command),
    }
}

/// Says and returns what a failed lock call means: the -E status for a conflict or a timeout
/// (said only with `--verbose`), else flock's status for a lock failure.
fn conflict_or_failure(prog: &str, o: &args::Options, f: lock::Fail, what: &str) -> i32 {
    match f {
        lock::Fail::Conflict => {
            if o.verbose {
                warn(prog, "failed to get lock");
            }
            i32::from(o.conflict)
        }
        lock::Fail::Timeout => {
            if o.verbose {
                warn(prog, "timeout while waiting to get lock");
            }
            i32::from(o.conflict)
        }
        lock::Fail::Os(e) => {
            warn(prog, &format!("{what}: {}", strerror(e)));
            lock::lock_failure_code(e)
        }
    }
}

/// The C library's text for `e` ("Bad file descriptor"), as flock(1) prints it.
fn strerror(e: nix::errno::Errno) -> String {
    let s = std::io::Error::from_raw_os_error(e as i32).to_string();
    match s.rfind(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// `--verbose`'s "getting lock took S.UUUUUU seconds", on stdout.
fn took(prog: &str, started: Instant) {
    let d = started.elapsed();
    print_out(&format!(
        "{prog}: getting lock took {}.{:06} seconds\n",
        d.as_secs(),
        d.subsec_micros()
    ));
}

/// Writes to stdout and flushes (the command shares it), ignoring failure.
fn print_out(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

/// One line on stderr, escaped (file names and arguments come from anywhere), ignoring failure.
fn raw_err(line: &str) {
    let _ = writeln!(std::io::stderr(), "{}", leasehold::text::scrub(line));
}

/// `PROG: MESSAGE` on stderr, as flock's `warn`/`warnx`.
fn warn(prog: &str, msg: &str) {
    raw_err(&format!("{prog}: {msg}"));
}
