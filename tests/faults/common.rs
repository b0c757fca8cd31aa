//! Shared helpers for the fault-injection suite (tests/faults_*.rs), included with
//! `#[path = "faults/common.rs"] mod common;`.
//!
//! - skipping (or, with `CI` set, failing) when a tool or root is missing;
//! - trial counts scaled by `LEASEHOLD_TRIALS` (the kill-trial count, default 1000; the other
//!   scenarios scale by LEASEHOLD_TRIALS / 1000);
//! - RAII guards for tmpfs mounts and child processes (always unmounted / killed and reaped);
//! - a helper mode of the test binary itself (`FAULTS_HELPER=...`) that holds a lease through
//!   the library, so a library holder can be a separate process that the suite can kill;
//! - an overlap detector for critical sections (`cs_enter` / `cs_leave`);
//! - the checks every scenario repeats: LOCK parses, no stray files beside it.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// True when running under CI (`CI` set to anything but empty, `0` or `false`).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// When `missing` is true: in CI, fail; otherwise print the reason and return true (skip).
#[track_caller]
pub fn skip(missing: bool, why: &str) -> bool {
    if !missing {
        return false;
    }
    let at = std::panic::Location::caller();
    if ci() {
        panic!("faults: required in CI but missing ({at}): {why}");
    }
    eprintln!("faults: SKIP ({at}): {why}");
    true
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips unless root (and fails in CI, which runs as root).
#[track_caller]
pub fn need_root() -> bool {
    skip(!is_root(), "needs root (mounts, namespaces, other users)")
}

/// Whether `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

#[track_caller]
pub fn need_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    skip(
        !missing.is_empty(),
        &format!(
            "missing tools: {} (Debian: util-linux, mount, coreutils)",
            missing.join(", ")
        ),
    )
}

/// The kill-trial count (`LEASEHOLD_TRIALS`, default 1000).
pub fn base_trials() -> usize {
    std::env::var("LEASEHOLD_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// `default` scaled by LEASEHOLD_TRIALS / 1000, at least 1.
pub fn scaled(default: usize) -> usize {
    (default * base_trials()).div_ceil(1000).max(1)
}

/// The leasehold binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_leasehold"))
}

/// Whether the command line (`leasehold run/status/break`) is implemented.
pub fn cli_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        Command::new(bin())
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| {
                let text = String::from_utf8_lossy(&o.stdout);
                o.status.success() && text.contains("run") && text.contains("status")
            })
    })
}

#[track_caller]
pub fn need_cli() -> bool {
    skip(
        !cli_ready(),
        "`leasehold --help` does not work yet (the CLI of issue 3 is not built)",
    )
}

/// A small deterministic PRNG (xorshift64*); the seed is printed so a failure can be replayed
/// with FAULTS_SEED.
pub struct Rng(u64);

impl Rng {
    pub fn new(name: &str) -> Rng {
        let seed = std::env::var("FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos() as u64
                    ^ u64::from(std::process::id()) << 32
            });
        eprintln!("faults: {name}: seed {seed} (replay with FAULTS_SEED={seed})");
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Polls `cond` every millisecond until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn run_quiet(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

/// A private tmpfs mounted on a fresh directory; unmounted (lazily if need be) on drop.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-faults-")
            .tempdir()
            .expect("temp dir")
            .keep();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0755"))
            .arg("tmpfs")
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount tmpfs on {}: {st}", dir.display());
        Tmpfs { dir }
    }

    /// Remounts read-only; false when the kernel refuses (EBUSY while a file is open for write).
    pub fn remount_ro(&self) -> bool {
        run_quiet(
            Command::new("mount")
                .args(["-o", "remount,ro"])
                .arg(&self.dir),
        )
        .is_ok_and(|s| s.success())
    }

    /// Lazily unmounts: open files keep working, the path no longer leads to them.
    pub fn lazy_unmount(&self) -> bool {
        run_quiet(Command::new("umount").arg("-l").arg(&self.dir)).is_ok_and(|s| s.success())
    }

    /// Fills the file system to 0 bytes available with `name`.
    pub fn fill(&self, name: &str) {
        let _ = run_quiet(
            Command::new("dd")
                .arg("if=/dev/zero")
                .arg(format!("of={}", self.dir.join(name).display()))
                .arg("bs=4k"),
        );
        let _ = run_quiet(
            Command::new("dd")
                .arg("if=/dev/zero")
                .arg(format!(
                    "of={}",
                    self.dir.join(format!("{name}.small")).display()
                ))
                .arg("bs=1"),
        );
        let st = nix::sys::statvfs::statvfs(&self.dir).expect("statvfs");
        assert_eq!(st.blocks_available(), 0, "tmpfs not full");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Unmount every layer (a test may have mounted over it), lazily if busy.
        for _ in 0..4 {
            let mounted = fs::read_to_string("/proc/self/mountinfo")
                .map(|m| {
                    m.lines()
                        .any(|l| l.split(' ').nth(4) == Some(self.dir.to_str().unwrap_or("")))
                })
                .unwrap_or(false);
            if !mounted {
                break;
            }
            let ok = run_quiet(Command::new("umount").arg(&self.dir)).is_ok_and(|s| s.success());
            if !ok {
                let _ = self.lazy_unmount();
            }
        }
        // A holder that outlived a lazy unmount may have written its helpers into the bare
        // mount point; everything here is ours.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A child process that is SIGKILLed (and SIGCONTed, in case it was stopped) and reaped on
/// drop, unless already waited for.
pub struct Kid {
    pub child: Child,
    pub what: String,
    pub status: Option<ExitStatus>,
}

impl Kid {
    pub fn spawn(cmd: &mut Command, what: &str) -> Kid {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Kid {
            child,
            what: what.to_string(),
            status: None,
        }
    }
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if self.status.is_none() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig);
        }
    }
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }
    /// Non-blocking check.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }
    pub fn wait(&mut self) -> ExitStatus {
        if self.status.is_none() {
            self.status = Some(self.child.wait().expect("wait"));
        }
        self.status.unwrap()
    }
    /// Waits at most `timeout`; kills it after that and panics.
    pub fn wait_timeout(&mut self, timeout: Duration) -> ExitStatus {
        if !wait_for(timeout, || self.try_wait().is_some()) {
            self.kill();
            self.wait();
            panic!("{} did not exit within {timeout:?}", self.what);
        }
        self.status.unwrap()
    }
    pub fn kill_and_reap(&mut self) -> ExitStatus {
        self.kill();
        self.wait()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill();
            let _ = self.child.wait();
        }
    }
}

/// Exit code of a status, or 128+signal.
pub fn code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// /proc state letter of `pid`, `None` when gone.
pub fn proc_state(pid: i32) -> Option<char> {
    leasehold::process::stat(pid)
        .ok()
        .flatten()
        .map(|s| s.state)
}

/// Alive = exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X' | 'x'))
}

/// Entries beside LOCK that leasehold does not document, and how many temp files there are.
pub fn stray_files(dir: &Path, lock_name: &str) -> Vec<String> {
    let allowed = [
        lock_name.to_string(),
        format!(".{lock_name}.leasehold-mutex"),
        // A crashed writer's temp file: recycled by the next writer, so at most one.
        format!(".{lock_name}.leasehold-tmp"),
        format!(".{lock_name}.leasehold-queue"),
    ];
    // Observation files are per uid: `.NAME.leasehold-seen-<uid>`.
    let seen = format!(".{lock_name}.leasehold-seen-");
    let mut stray = Vec::new();
    for e in fs::read_dir(dir).expect("read lock dir").flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let is_seen = n
            .strip_prefix(&seen)
            .is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()));
        if !allowed.contains(&n) && !is_seen {
            stray.push(n);
        }
    }
    stray
}

/// LOCK (if present and not empty) is JSON and the library can judge it; returns the verdict.
pub fn assert_lock_parses(lock: &Path) -> leasehold::Verdict {
    if let Ok(bytes) = fs::read(lock)
        && !bytes.iter().all(u8::is_ascii_whitespace)
        && let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes)
    {
        panic!(
            "LOCK is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
    leasehold::status(lock).unwrap_or_else(|e| panic!("status({}) failed: {e}", lock.display()))
}

/// Bytes, mtime, inode, mode and owner of a path (not following a symlink), for "nothing was
/// modified" checks. Directories list their entries instead of bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub bytes: Vec<u8>,
    pub mtime: (i64, i64),
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub size: u64,
}

pub fn snapshot(p: &Path) -> Option<Snapshot> {
    let m = fs::symlink_metadata(p).ok()?;
    let bytes = if m.file_type().is_symlink() {
        fs::read_link(p).ok()?.into_os_string().into_encoded_bytes()
    } else if m.is_dir() {
        let mut names: Vec<String> = fs::read_dir(p)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.join("\n").into_bytes()
    } else if m.is_file() && m.len() <= 1 << 20 {
        fs::read(p).ok()?
    } else {
        Vec::new()
    };
    Some(Snapshot {
        bytes,
        mtime: (m.mtime(), m.mtime_nsec()),
        ino: m.ino(),
        mode: m.mode(),
        uid: m.uid(),
        size: m.len(),
    })
}

// ---------------------------------------------------------------------------------------------
// The helper mode: the test binary re-executed to play a library holder in its own process.

/// The command that re-runs this test binary as a helper. Each faults_*.rs declares
/// `#[test] fn helper() { common::helper_main() }`, which does nothing unless FAULTS_HELPER is set.
/// How a contender takes the lease: through the library, or wrapped by `leasehold run`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Library,
    Cli,
}

/// A contender for `lock` (TTL `ttl`, heartbeat 20 ms, waiting at most `wait`) whose critical
/// section lasts `hold_ms` and registers with the overlap detector in `cs`: the `hold` helper
/// through the library, or the `cs` helper under `leasehold run`. Stderr is piped, as
/// [`Kid::spawn`] expects.
pub fn contender(
    mode: Mode,
    lock: &Path,
    ttl: Duration,
    wait: Duration,
    hold_ms: u64,
    cs: &Path,
) -> Command {
    let mut c = match mode {
        Mode::Library => {
            let mut c = helper_cmd("hold");
            c.env("FAULTS_LOCK", lock)
                .env("FAULTS_TTL_MS", ttl.as_millis().to_string())
                .env("FAULTS_HB_MS", "20")
                .env("FAULTS_WAIT_MS", wait.as_millis().to_string());
            c
        }
        Mode::Cli => {
            let mut c = Command::new(bin());
            c.args(["run", "-q", "--heartbeat", "20ms"])
                .arg("--ttl")
                .arg(format!("{}ms", ttl.as_millis()))
                .arg("-w")
                .arg(format!("{}ms", wait.as_millis()))
                .arg(lock)
                .arg("--")
                .arg(std::env::current_exe().expect("current_exe"))
                .args(["helper", "--exact", "--nocapture", "--test-threads=1", "-q"])
                .env("FAULTS_HELPER", "cs")
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            c
        }
    };
    c.env("FAULTS_HOLD_MS", hold_ms.to_string())
        .env("FAULTS_CS", cs)
        .stderr(Stdio::piped());
    c
}

pub fn helper_cmd(mode: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args(["helper", "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env("FAULTS_HELPER", mode)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    c
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// Writes `text` to `path` atomically (the reader polls for the file).
pub fn signal_file(path: &Path, text: &str) {
    let tmp = path.with_extension("part");
    fs::write(&tmp, text).expect("write ready file");
    fs::rename(&tmp, path).expect("rename ready file");
}

/// Entry point of the helper modes; returns at once when FAULTS_HELPER is not set.
///
/// - `hold`: acquire FAULTS_LOCK (TTL FAULTS_TTL_MS, heartbeat FAULTS_HB_MS, waiting at most
///   FAULTS_WAIT_MS), write the token to FAULTS_READY, hold for FAULTS_HOLD_MS (forever if unset)
///   or until lost, release, exit 0 (74 when lost, the error's exit code when acquiring failed).
///   With FAULTS_CS set, the hold is a critical section checked by the overlap detector.
/// - `cs`: a command run under `leasehold run`: the critical section itself (LEASEHOLD_TOKEN),
///   held for FAULTS_HOLD_MS.
pub fn helper_main() {
    let Ok(mode) = std::env::var("FAULTS_HELPER") else {
        return;
    };
    let code = match mode.as_str() {
        "hold" => helper_hold(),
        "cs" => helper_cs(),
        other => {
            eprintln!("unknown helper mode {other}");
            70
        }
    };
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

fn helper_hold() -> i32 {
    let lock = PathBuf::from(std::env::var("FAULTS_LOCK").expect("FAULTS_LOCK"));
    let ttl = env_ms("FAULTS_TTL_MS").unwrap_or(Duration::from_millis(200));
    let mut b = leasehold::LeaseBuilder::new(&lock).ttl(ttl).durable(false);
    if let Some(hb) = env_ms("FAULTS_HB_MS") {
        b = b.heartbeat(hb);
    }
    let g = match env_ms("FAULTS_WAIT_MS") {
        Some(w) => b.acquire_timeout(w),
        None => b.try_acquire(),
    };
    let g = match g {
        Ok(g) => g,
        Err(e) => {
            eprintln!("leasehold helper: {e}");
            return leasehold_cli::exit_code(&e);
        }
    };
    let cs = std::env::var_os("FAULTS_CS").map(PathBuf::from);
    if let Some(d) = &cs {
        cs_enter(d, g.token());
    }
    if let Some(r) = std::env::var_os("FAULTS_READY") {
        signal_file(Path::new(&r), &g.token().to_string());
    }
    let hold = env_ms("FAULTS_HOLD_MS").unwrap_or(Duration::from_secs(3600));
    let lost = g.wait_lost(hold);
    if let Some(d) = &cs {
        cs_leave(d, g.token());
    }
    if let Some(why) = lost {
        eprintln!("leasehold helper: lost: {why}");
        return 74;
    }
    match g.release() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("leasehold helper: release: {e}");
            leasehold_cli::exit_code(&e)
        }
    }
}

fn helper_cs() -> i32 {
    let d = PathBuf::from(std::env::var("FAULTS_CS").expect("FAULTS_CS"));
    let token: u64 = std::env::var("LEASEHOLD_TOKEN")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    cs_enter(&d, token);
    if let Some(r) = std::env::var_os("FAULTS_READY") {
        signal_file(Path::new(&r), &token.to_string());
    }
    std::thread::sleep(env_ms("FAULTS_HOLD_MS").unwrap_or(Duration::from_millis(20)));
    cs_leave(&d, token);
    0
}

// ---------------------------------------------------------------------------------------------
// Overlap detector: every critical section registers `pid start` under its token in a directory;
// entering while another registered process is still alive (same pid AND start time, not a
// zombie) is a violation, appended to `<dir>/../violations`.

fn start_of(pid: i32) -> Option<u64> {
    leasehold::process::stat(pid)
        .ok()
        .flatten()
        .filter(|s| !s.is_dead())
        .map(|s| s.start)
}

pub fn cs_enter(dir: &Path, token: u64) {
    let me = std::process::id() as i32;
    let mut clash = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(text) = fs::read_to_string(e.path()) else {
            continue;
        };
        let mut it = text.split_whitespace();
        let (Some(pid), Some(start)) = (
            it.next().and_then(|p| p.parse::<i32>().ok()),
            it.next().and_then(|s| s.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if pid != me && start_of(pid) == Some(start) {
            clash.push(format!(
                "token {token} (pid {me}) entered while token {} (pid {pid}) is alive",
                e.file_name().to_string_lossy()
            ));
        }
    }
    if !clash.is_empty()
        && let Some(parent) = dir.parent()
        && let Ok(mut f) = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(parent.join("violations"))
    {
        let _ = writeln!(f, "{}", clash.join("\n"));
    }
    let start = start_of(me).unwrap_or(0);
    let _ = fs::write(dir.join(token.to_string()), format!("{me} {start}\n"));
}

pub fn cs_leave(dir: &Path, token: u64) {
    let _ = fs::remove_file(dir.join(token.to_string()));
}

/// Violations recorded by the detector under `work` (the parent of the cs directory).
pub fn violations(work: &Path) -> Vec<String> {
    fs::read_to_string(work.join("violations"))
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Reads the heartbeat sequence and lease id from LOCK, if it holds a lease.
pub fn lease_key(lock: &Path) -> Option<(String, u64, String)> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(lock).ok()?).ok()?;
    Some((
        v["lease_id"].as_str()?.to_string(),
        v["heartbeat_seq"].as_u64()?,
        v["state"].as_str()?.to_string(),
    ))
}
