//! Helpers for the library tests (the `core` binary, and others that drive the library):
//! scratch directories, crafted lease records, and the worker roles `holder`, `oneshot` and
//! `exclusion` (see [`super::worker`]).

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Holder, Identity, Lease, LeaseBuilder, LeaseState, SkewedClock};

use super::cs::{Cs, Kind};
use super::proc::Proc;
use super::worker::{self, say};

/// A temporary directory, on /dev/shm when it is usable (fast fsync, fast everything).
pub fn tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::Builder::new()
            .prefix("leasehold-core-")
            .tempdir_in(shm)
    {
        return d;
    }
    tempfile::Builder::new()
        .prefix("leasehold-core-")
        .tempdir()
        .expect("create a tempdir")
}

/// Microseconds since the epoch (for timestamps written by workers on this one host).
pub fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

/// A random-enough 32-hex-digit lease id.
pub fn lease_id() -> String {
    let mut b = [0u8; 16];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).expect("getrandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A held lease record naming `pid`/`pid_start` on `who`'s host, crafted by hand.
pub fn crafted(pid: i32, pid_start: u64, who: &Identity, ttl: Duration, token: u64) -> Lease {
    let now = leasehold::format_rfc3339(SystemTime::now());
    Lease {
        state: LeaseState::Held,
        heartbeat_seq: 1,
        heartbeat_at: now.clone(),
        lease_id: lease_id(),
        token,
        ttl_ms: ttl.as_millis() as u64,
        acquired_at: now,
        holder: Holder {
            pid,
            pid_start,
            child_pid: None,
            child_start: None,
            pgid: None,
            host: who.host.clone(),
            boot_id: who.boot_id.clone(),
            pid_ns: who.pid_ns,
            uid: who.uid,
            user: who.user.clone(),
            command: vec!["crafted-by-test".into()],
            note: Some("crafted by a core test".into()),
            on_behalf: false,
        },
        ended: None,
        mode: None,
        history: Default::default(),
        damaged: false,
    }
}

/// Writes `bytes` at `path` atomically (temp + rename), as a foreign writer would.
pub fn write_atomic(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("test-tmp");
    fs::write(&tmp, bytes).expect("write temp");
    fs::rename(&tmp, path).expect("rename into place");
}

/// Reads the lease JSON at `path` without the library (None if unreadable or torn).
pub fn raw_lease(path: &Path) -> Option<serde_json::Value> {
    let b = fs::read(path).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Appends one line with a single O_APPEND write.
pub fn append_line(path: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
        .expect("open log");
    f.write_all(format!("{line}\n").as_bytes()).expect("append");
}

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap_or_else(|_| panic!("worker needs {name}")))
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()
        .map(|v| Duration::from_millis(v.parse().expect("milliseconds")))
}

/// Role `holder`: takes the lease at `LH_LOCK` (TTL `LH_TTL_MS`, heartbeat `LH_HB_MS`, identity
/// host/boot/namespace overridden by `LH_HOST`/`LH_BOOT`/`LH_NS`, wall clock skewed by
/// `LH_SKEW_S` seconds, negative = behind), prints `READY token lease_id pid`, prints
/// `LOST reason` if the guard is lost, and on stdin EOF prints `SEQ n lost` and releases
/// (`RELEASED ok` or `RELEASED error E`, exit 0); `FAILED error` and exit 2 if it cannot acquire.
pub fn holder_role() -> i32 {
    let lock = env_path("LH_LOCK");
    let ttl = env_ms("LH_TTL_MS").expect("LH_TTL_MS");
    let mut id = Identity::current();
    if let Ok(h) = std::env::var("LH_HOST") {
        id.host = h;
    }
    if let Ok(b) = std::env::var("LH_BOOT") {
        id.boot_id = b;
    }
    if let Ok(n) = std::env::var("LH_NS") {
        id.pid_ns = n.parse().expect("LH_NS");
    }
    let mut b = LeaseBuilder::new(&lock)
        .ttl(ttl)
        .identity(id)
        .note("core test holder")
        .on_lost(|r| say(&format!("LOST {r}")));
    if let Some(hb) = env_ms("LH_HB_MS") {
        b = b.heartbeat(hb);
    }
    if let Ok(s) = std::env::var("LH_SKEW_S") {
        let s: i64 = s.parse().expect("LH_SKEW_S");
        let by = Duration::from_secs(s.unsigned_abs());
        let clock = if s >= 0 {
            SkewedClock::ahead(by)
        } else {
            SkewedClock::behind(by)
        };
        b = b.clock(Arc::new(clock));
    }
    let g = match b.acquire_timeout(Duration::from_secs(20)) {
        Ok(g) => g,
        Err(e) => {
            say(&format!("FAILED {e}"));
            return 2;
        }
    };
    say(&format!(
        "READY {} {} {}",
        g.token(),
        g.lease_id(),
        std::process::id()
    ));
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    say(&format!("SEQ {} {}", g.lease().heartbeat_seq, g.is_lost()));
    match g.release_with("exit 0") {
        Ok(()) => say("RELEASED ok"),
        Err(e) => say(&format!("RELEASED error {e}")),
    }
    0
}

/// Role `oneshot`: one `try_acquire` on `LH_LOCK`, prints `OUTCOME acquired TOKEN`,
/// `OUTCOME wouldblock VERDICT` or `OUTCOME error ERROR`, releases, exits 0.
pub fn oneshot_role() -> i32 {
    let lock = env_path("LH_LOCK");
    let ttl = env_ms("LH_TTL_MS").expect("LH_TTL_MS");
    match LeaseBuilder::new(&lock).ttl(ttl).try_acquire() {
        Ok(g) => {
            say(&format!("OUTCOME acquired {}", g.token()));
            let _ = g.release_with("exit 0");
        }
        Err(leasehold::Error::WouldBlock { verdict, .. }) => {
            say(&format!("OUTCOME wouldblock {verdict}"))
        }
        Err(e) => say(&format!("OUTCOME error {e}")),
    }
    0
}

/// Spawns a `holder` worker on `lock` and waits for its `READY` line.
/// Returns the child and (token, lease_id).
pub fn spawn_holder(lock: &Path, ttl: Duration, extra: &[(&str, String)]) -> (Proc, u64, String) {
    let mut cmd = worker::cmd("holder");
    cmd.env("LH_LOCK", lock)
        .env("LH_TTL_MS", ttl.as_millis().to_string());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let p = Proc::spawn_piped(cmd, "holder");
    let ready = p.line("READY", Duration::from_secs(20));
    let mut it = ready.split_whitespace();
    let token = it.next().expect("token").parse().expect("token number");
    let id = it.next().expect("lease id").to_string();
    (p, token, id)
}

// ---------------------------------------------------------------------------------------------
// The mutual-exclusion worker (the `exclusion` tests).

/// Names inside the exclusion test's directory: the lock, the critical-section checker's
/// directory, and the log of critical sections.
pub struct CsFiles {
    pub lock: PathBuf,
    pub cs: PathBuf,
    pub log: PathBuf,
}

impl CsFiles {
    /// The names, and the checker's directory created under `dir`.
    pub fn new(dir: &Path) -> CsFiles {
        let f = CsFiles::at(dir);
        if !f.cs.exists() {
            Cs::new(dir, "cs");
        }
        f
    }

    /// Asserts that the run ended idle: no critical section left occupied, the lock free (the
    /// last holder released).
    #[track_caller]
    pub fn assert_idle(&self) {
        assert!(
            !self.cs.join("inside").exists(),
            "a critical section was left occupied"
        );
        assert_eq!(
            leasehold::status(&self.lock).unwrap().state,
            leasehold::State::Free,
            "the last holder released"
        );
    }

    fn at(dir: &Path) -> CsFiles {
        CsFiles {
            lock: dir.join("cs.lock"),
            cs: dir.join("cs"),
            log: dir.join("cs.log"),
        }
    }

    /// The critical-section checker.
    pub fn checker(&self) -> Cs {
        Cs::open(&self.cs)
    }
}

/// Role `exclusion`: loops acquiring the lease at `LH_DIR/cs.lock` (TTL `LH_TTL_MS`) until
/// `LH_TARGET` critical sections are logged in total; the worker's name is `LH_NAME`; `LH_MODE`
/// makes it a shared or counted lock (see [`shared_mode`]).
///
/// Each critical section is checked by the shared checker ([`Cs::enter`] as `NAME.N`, so that
/// the test declares a worker killed with [`Cs::declare_killed`]`(NAME)` before it SIGKILLs
/// it), appends `T token pid micros` to the log, holds `LH_HOLD_MS`, and leaves. A guard lost
/// during the critical section is logged as `L`. Exits 3 if it cannot acquire within 20 s, 5 if
/// release fails.
pub fn exclusion_role() -> i32 {
    let dir = env_path("LH_DIR");
    let f = CsFiles::at(&dir);
    let cs = f.checker();
    let ttl = env_ms("LH_TTL_MS").expect("LH_TTL_MS");
    let target: usize = std::env::var("LH_TARGET")
        .expect("LH_TARGET")
        .parse()
        .expect("LH_TARGET");
    let name = std::env::var("LH_NAME").expect("LH_NAME");
    let hold = env_ms("LH_HOLD_MS").unwrap_or(Duration::ZERO);
    let me = std::process::id() as i32;
    let mode = std::env::var("LH_MODE").unwrap_or_default();
    let mut seed = (now_us() as u64) ^ ((me as u64) << 32) | 1;
    for n in 0.. {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let (b, kind) = shared_mode(LeaseBuilder::new(&f.lock).ttl(ttl), &mode, seed);
        let g = match b.acquire_timeout(Duration::from_secs(20)) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("exclusion worker {me}: acquire failed: {e}");
                return 3;
            }
        };
        let token = g.token();
        let section = match kind {
            None => cs.enter(&format!("{name}.{n}")),
            Some((kind, limit)) => cs.enter_as(&format!("{name}.{n}"), kind, limit),
        };
        let done = fs::read_to_string(&f.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("T "))
            .count();
        let finished = done >= target;
        if !finished {
            append_line(&f.log, &format!("T {token} {me} {}", now_us()));
            if !hold.is_zero() {
                std::thread::sleep(hold);
            }
        }
        if g.is_lost() {
            append_line(&f.log, &format!("L {token} {me} {:?}", g.loss()));
        }
        section.leave();
        if let Err(e) = g.release() {
            eprintln!("exclusion worker {me}: release failed: {e}");
            return 5;
        }
        if finished {
            return 0;
        }
    }
    unreachable!()
}

/// The `exclusion` role's setting for one acquisition, from `LH_MODE`: empty for a plain
/// lock; `shared` for a readers-writer lock (a quarter of the acquisitions exclusive, chosen
/// by `seed`); `slots N` for a semaphore of N. With the checker's kind and limit.
fn shared_mode(b: LeaseBuilder, mode: &str, seed: u64) -> (LeaseBuilder, Option<(Kind, usize)>) {
    if mode == "shared" {
        return match seed % 4 {
            0 => (b, Some((Kind::Exclusive, usize::MAX))),
            _ => (b.shared(true), Some((Kind::Shared, usize::MAX))),
        };
    }
    match mode
        .strip_prefix("slots ")
        .and_then(|n| n.parse::<u32>().ok())
    {
        Some(n) => (b.slots(n), Some((Kind::Shared, n as usize))),
        None => (b, None),
    }
}

/// In a kill loop: panics if a worker exited by itself (workers exit only at the end, or on a
/// violation), with its stderr and the checker's violations.
#[track_caller]
pub fn assert_none_exited(workers: &mut [Proc], label: &str, files: &CsFiles) {
    for w in workers {
        if let Some(st) = w.try_wait() {
            panic!(
                "{label}worker {} exited by itself with {st}: {} violations {:?}",
                w.pid(),
                w.stderr_so_far(),
                files.checker().violations()
            );
        }
    }
}

/// Progress of a kill loop: how many critical sections the log holds, and for how long none
/// was added (the lock must recover within a bound however the kills land).
pub struct Progress {
    done: usize,
    since: std::time::Instant,
    /// The longest time seen without a new critical section.
    pub stalled_max: std::time::Duration,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            done: 0,
            since: std::time::Instant::now(),
            stalled_max: std::time::Duration::ZERO,
        }
    }

    /// Reads the log at `log`, fails (naming `what`) when no critical section was added for
    /// `bound`, and returns how many there are.
    #[track_caller]
    pub fn check(
        &mut self,
        log: &std::path::Path,
        bound: std::time::Duration,
        what: &str,
    ) -> usize {
        let done = CsReport::read(log).entries.len();
        if done != self.done {
            (self.done, self.since) = (done, std::time::Instant::now());
        }
        let stalled = self.since.elapsed();
        self.stalled_max = self.stalled_max.max(stalled);
        assert!(
            stalled < bound,
            "{what}: no critical section for {stalled:?} after {done} of them: the lock did not recover"
        );
        done
    }
}

/// What the exclusion log says.
#[derive(Debug, Default)]
pub struct CsReport {
    /// `(token, pid, micros)` of every critical section, in log order.
    pub entries: Vec<(u64, i32, u128)>,
    /// Guards lost inside a critical section (must be none).
    pub lost: Vec<String>,
}

impl CsReport {
    pub fn read(log: &Path) -> CsReport {
        let mut r = CsReport::default();
        for l in fs::read_to_string(log).unwrap_or_default().lines() {
            if let Some(rest) = l.strip_prefix("T ") {
                let v: Vec<&str> = rest.split_whitespace().collect();
                r.entries.push((
                    v[0].parse().expect("token"),
                    v[1].parse().expect("pid"),
                    v[2].parse().expect("micros"),
                ));
            } else if let Some(rest) = l.strip_prefix("L ") {
                r.lost.push(rest.to_string());
            }
        }
        r
    }

    /// Positions where the token did not strictly increase, as `(index, previous, this)`.
    pub fn token_regressions(&self) -> Vec<(usize, u64, u64)> {
        self.entries
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1].0 <= w[0].0)
            .map(|(i, w)| (i + 1, w[0].0, w[1].0))
            .collect()
    }

    /// Asserts that exactly `target` critical sections were logged, no guard was lost inside
    /// one, and their tokens strictly increased.
    #[track_caller]
    pub fn assert_sound(&self, target: usize) {
        assert!(
            self.lost.is_empty(),
            "guards lost in a critical section: {:?}",
            self.lost
        );
        assert_eq!(self.entries.len(), target);
        let regressions = self.token_regressions();
        assert!(
            regressions.is_empty(),
            "tokens not strictly increasing: {:?}",
            &regressions[..regressions.len().min(10)]
        );
    }

    /// The longest time between two consecutive critical sections.
    pub fn worst_gap(&self) -> Duration {
        self.entries
            .windows(2)
            .map(|w| Duration::from_micros(w[1].2.saturating_sub(w[0].2) as u64))
            .max()
            .unwrap_or_default()
    }
}

/// Waits (at most `limit`) until the lease in `lock` shows a renewal its holder made after this
/// call: its `heartbeat_seq` moves past the value read now, under the same lease id. A negative
/// check ("the holder did not lose its lease", "the command was not touched") made after this
/// has given the failure a heartbeat to appear.
#[track_caller]
pub fn wait_for_renewal(lock: &Path, limit: Duration) {
    let key = |v: serde_json::Value| {
        Some((
            v["lease_id"].as_str()?.to_string(),
            v["heartbeat_seq"].as_u64()?,
        ))
    };
    let (id, seq) = raw_lease(lock)
        .and_then(key)
        .expect("a lease with an id and a heartbeat sequence");
    let renewed = super::wait::wait_until(limit, || {
        raw_lease(lock)
            .and_then(key)
            .is_some_and(|(i, s)| i == id && s > seq)
    });
    assert!(
        renewed,
        "the holder of {} did not renew lease {id} (seq {seq}) within {limit:?}",
        lock.display()
    );
}
