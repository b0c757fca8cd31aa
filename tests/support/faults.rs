//! Helpers for fault injection: trial counts scaled by `LEASEHOLD_TRIALS`, a seeded PRNG, RAII
//! tmpfs mounts (always unmounted), the checks every scenario repeats (LOCK parses, nothing
//! undocumented beside it or in its queue directory), "nothing was modified" snapshots, and the
//! contender roles `hold` (a library holder in its own process) and `cs` (a command under
//! `leasehold run`), both checked by the shared critical-section checker ([`super::cs`]).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::cli::bin;
use super::cs::{Cs, Section};
use super::worker;

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

/// Runs `cmd` to its end: `Err` (naming the command) unless it ran and exited 0.
fn succeeds(cmd: &mut Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    match cmd.status() {
        Ok(st) if st.success() => Ok(()),
        Ok(st) => Err(format!("{what}: {st}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// An ext4 file system on a loop device over an image file (the image kept in `dir`, a
/// private tmpfs), mounted on a fresh directory: a real disk that can lose what was never
/// synced. [`LoopExt4::shut_down`] makes it fail as a detached disk does (every later call
/// gets EIO, nothing unsynced is written); [`LoopExt4::reattach`] attaches what reached the
/// disk as a new device and mounts it — a new superblock in the same boot, as when a disk
/// that dropped off comes back. Unmounted (lazily if need be) and detached on drop.
pub struct LoopExt4 {
    pub mnt: PathBuf,
    image: PathBuf,
    device: String,
    // Dropped last: the image lives on it.
    images: std::rc::Rc<Tmpfs>,
}

impl LoopExt4 {
    /// A fresh 32 MiB ext4, or `Err(why)` when this machine cannot attach a loop device.
    pub fn new() -> Result<LoopExt4, String> {
        let images = std::rc::Rc::new(Tmpfs::new("160m"));
        let image = images.dir.join("disk-0.img");
        succeeds(Command::new("truncate").args(["-s", "32M"]).arg(&image))?;
        succeeds(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
        LoopExt4::attach(images, image)
    }

    fn attach(images: std::rc::Rc<Tmpfs>, image: PathBuf) -> Result<LoopExt4, String> {
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&image)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "losetup -f --show {}: {}",
                image.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        let device = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let mnt = tempfile::Builder::new()
            .prefix("leasehold-disk-")
            .tempdir()
            .map_err(|e| format!("mount point: {e}"))?
            .keep();
        let d = LoopExt4 {
            mnt,
            image,
            device,
            images,
        };
        succeeds(Command::new("mount").arg(&d.device).arg(&d.mnt))?;
        Ok(d)
    }

    /// Shuts the file system down without flushing its journal (`EXT4_IOC_SHUTDOWN`,
    /// `EXT4_GOING_FLAGS_NOLOGFLUSH`): what was synced is on the disk, nothing else will be,
    /// and every later call on it fails with EIO.
    pub fn shut_down(&self) {
        nix::ioctl_read!(ext4_shutdown, b'X', 125, u32);
        let dir = fs::File::open(&self.mnt).expect("open the mount point");
        let mut flags: u32 = 2; // EXT4_GOING_FLAGS_NOLOGFLUSH
        // SAFETY: the ioctl reads one u32 through a pointer to a live local.
        unsafe { ext4_shutdown(std::os::fd::AsRawFd::as_raw_fd(&dir), &mut flags) }
            .expect("EXT4_IOC_SHUTDOWN");
    }

    /// What reached the disk, attached again as a new device and mounted elsewhere.
    pub fn reattach(&self) -> Result<LoopExt4, String> {
        let copy = self.image.with_file_name(format!(
            "disk-{}.img",
            self.device.rsplit('/').next().unwrap_or("x")
        ));
        fs::copy(&self.image, &copy).map_err(|e| format!("copy the disk image: {e}"))?;
        LoopExt4::attach(self.images.clone(), copy)
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let ok = run_quiet(Command::new("umount").arg(&self.mnt)).is_ok_and(|s| s.success());
        if !ok {
            let _ = run_quiet(Command::new("umount").arg("-l").arg(&self.mnt));
        }
        // Detached once the last user lets go (autoclear), even after a lazy unmount.
        let _ = run_quiet(Command::new("losetup").arg("-d").arg(&self.device));
        let _ = fs::remove_dir(&self.mnt);
    }
}

/// Entries beside LOCK, and inside its queue directory, that leasehold does not document:
/// beside LOCK only LOCK, its mutex, one temp file, the queue directory and per-uid observation
/// files; in the queue directory only tickets `q-N` (20 digits) and `q-N.lease` beside its
/// own ticket.
pub fn stray_files(dir: &Path, lock_name: &str) -> Vec<String> {
    let allowed = [
        lock_name.to_string(),
        format!(".{lock_name}.leasehold-mutex"),
        // A crashed writer's temp file: recycled by the next writer, so at most one.
        format!(".{lock_name}.leasehold-tmp"),
        format!(".{lock_name}.leasehold-queue"),
        // The epoch record on a local disk (PROTOCOL.md §8).
        format!(".{lock_name}.leasehold-epoch"),
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
    let queue = dir.join(format!(".{lock_name}.leasehold-queue"));
    if let Ok(rd) = fs::read_dir(&queue) {
        let names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let is_ticket = |n: &str| {
            n.strip_prefix("q-")
                .is_some_and(|d| d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()))
        };
        for n in &names {
            let ok = is_ticket(n)
                || n.strip_suffix(".lease")
                    .is_some_and(|t| is_ticket(t) && names.iter().any(|m| m == t));
            if !ok {
                stray.push(format!(".{lock_name}.leasehold-queue/{n}"));
            }
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
// Contenders: the test binary re-run as a worker (super::worker) to hold a lease in its own
// process, each critical section checked by the shared checker (super::cs).

/// How a contender takes the lease: through the library, or wrapped by `leasehold run`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Library,
    Cli,
}

/// A contender named `id` for `lock` (TTL `ttl`, heartbeat 20 ms, waiting at most `wait`)
/// whose critical section lasts `hold_ms`, entered as job `id` of the checker in `cs`: the
/// `hold` role through the library, or the `cs` role as the command of `leasehold run`.
/// Stdout is closed, stderr piped.
pub fn contender(
    mode: Mode,
    id: &str,
    lock: &Path,
    ttl: Duration,
    wait: Duration,
    hold_ms: u64,
    cs: &Path,
) -> Command {
    let mut c = match mode {
        Mode::Library => {
            let mut c = worker::cmd("hold");
            c.env("FAULTS_LOCK", lock)
                .env("FAULTS_TTL_MS", ttl.as_millis().to_string())
                .env("FAULTS_HB_MS", "20")
                .env("FAULTS_WAIT_MS", wait.as_millis().to_string());
            c
        }
        Mode::Cli => {
            let w = worker::cmd("cs");
            let mut c = Command::new(bin());
            c.args(["run", "-q", "--heartbeat", "20ms"])
                .arg("--ttl")
                .arg(format!("{}ms", ttl.as_millis()))
                .arg("-w")
                .arg(format!("{}ms", wait.as_millis()))
                .arg(lock)
                .arg("--")
                .arg(w.get_program())
                .args(w.get_args())
                .env(worker::ROLE, "cs");
            c
        }
    };
    c.env("FAULTS_HOLD_MS", hold_ms.to_string())
        .env("FAULTS_CS", cs)
        .env("FAULTS_CS_ID", id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
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

/// The checker section of a contender: job `FAULTS_CS_ID` (else `token-N`) of the checker in
/// `FAULTS_CS`, if set.
fn cs_enter(token: u64) -> Option<Section> {
    let dir = std::env::var_os("FAULTS_CS")?;
    let id = std::env::var("FAULTS_CS_ID").unwrap_or_else(|_| format!("token-{token}"));
    Some(Cs::open(Path::new(&dir)).enter(&id))
}

/// Role `hold`: acquire FAULTS_LOCK (TTL FAULTS_TTL_MS, heartbeat FAULTS_HB_MS, waiting at most
/// FAULTS_WAIT_MS, else one try), enter the critical section (with FAULTS_CS set), write the
/// token to FAULTS_READY, hold for FAULTS_HOLD_MS (forever if unset) or until lost, leave,
/// release; exit 0 (74 when lost, the error's exit code when acquiring failed).
pub fn hold_role() -> i32 {
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
    let section = cs_enter(g.token());
    if let Some(r) = std::env::var_os("FAULTS_READY") {
        signal_file(Path::new(&r), &g.token().to_string());
    }
    let hold = env_ms("FAULTS_HOLD_MS").unwrap_or(Duration::from_secs(3600));
    let lost = g.wait_lost(hold);
    if let Some(s) = section {
        s.leave();
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

/// Role `cs`: the command run under `leasehold run`: the critical section itself (job
/// FAULTS_CS_ID of the checker in FAULTS_CS), writing LEASEHOLD_TOKEN to FAULTS_READY once
/// inside, held for FAULTS_HOLD_MS.
pub fn cs_role() -> i32 {
    let token: u64 = std::env::var("LEASEHOLD_TOKEN")
        .ok()
        .and_then(|t| t.parse().ok())
        .expect("LEASEHOLD_TOKEN (the cs role runs under leasehold run)");
    let section = cs_enter(token).expect("FAULTS_CS");
    if let Some(r) = std::env::var_os("FAULTS_READY") {
        signal_file(Path::new(&r), &token.to_string());
    }
    std::thread::sleep(env_ms("FAULTS_HOLD_MS").unwrap_or(Duration::from_millis(20)));
    section.leave();
    0
}

/// Reads the lease id, heartbeat sequence and state from LOCK, if it holds a lease.
pub fn lease_key(lock: &Path) -> Option<(String, u64, String)> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(lock).ok()?).ok()?;
    Some((
        v["lease_id"].as_str()?.to_string(),
        v["heartbeat_seq"].as_u64()?,
        v["state"].as_str()?.to_string(),
    ))
}

/// When the lease in LOCK was last seen to change (a heartbeat, another lease), by polling it
/// with [`lease_key`].
pub struct LastChange<'a> {
    lock: &'a Path,
    key: Option<(String, u64, String)>,
    /// When the last change was seen (at first: when watching began).
    pub at: Instant,
}

impl<'a> LastChange<'a> {
    pub fn new(lock: &'a Path) -> LastChange<'a> {
        LastChange {
            lock,
            key: lease_key(lock),
            at: Instant::now(),
        }
    }

    /// Reads LOCK once; returns when its lease was last seen to change.
    pub fn poll(&mut self) -> Instant {
        let k = lease_key(self.lock);
        if k != self.key {
            self.key = k;
            self.at = Instant::now();
        }
        self.at
    }
}

/// A fresh directory under /tmp (outside /root, so that other users can reach it) named
/// `prefix...`, with `mode`.
pub fn tmp_dir_with_mode(prefix: &str, mode: u32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(mode)).unwrap();
    d
}
