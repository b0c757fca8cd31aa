//! Shared helpers for the `core_*` integration tests.
//!
//! Worker processes are the test binary itself, re-executed with `--exact TEST --nocapture` and
//! the environment variable [`ROLE`] naming what to do; the test function checks for a role
//! first (see [`common_worker`]) and runs the worker instead of the test. Workers talk to the
//! test over their stdout, one line per fact, each line starting with a keyword (`READY`,
//! `LOST`, `OUTCOME`, ...); everything else libtest prints is ignored.
//!
//! Every child is wrapped in [`Proc`], which SIGKILLs and reaps it if the test did not (PID 1
//! does not reap orphans on these machines).

#![allow(dead_code)]

use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::{Holder, Identity, Lease, LeaseBuilder, LeaseState, SkewedClock};

/// Environment variable that turns a test binary run into a worker.
pub const ROLE: &str = "LEASEHOLD_CORE_WORKER";

/// The worker role this process was started in, if any.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

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

/// A command re-running this test binary as a worker in `role`, for the test named `test`.
pub fn worker(test: &str, role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args([
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ])
    .env(ROLE, role);
    c
}

/// Polls `cond` every `every` until it is true or `within` has passed; returns whether it held.
pub fn wait_until(within: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// Microseconds since the epoch (for timestamps written by workers on this one host).
pub fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

/// A spawned child: its output lines arrive on a channel; killed and reaped on drop.
pub struct Proc {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    name: String,
}

impl Proc {
    /// Spawns `cmd` with piped stdin and stdout (stderr inherited, for diagnostics).
    pub fn spawn(mut cmd: Command, name: &str) -> Proc {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            stdin,
            lines: rx,
            name: name.to_string(),
        }
    }

    /// The child's PID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next output line starting with `prefix` (the rest of the line), waiting at most
    /// `timeout`. Panics, naming the child, on timeout or end of output.
    pub fn line(&self, prefix: &str, timeout: Duration) -> String {
        match self.try_line(prefix, timeout) {
            Ok(s) => s,
            Err(why) => panic!("{}: no `{prefix}` line: {why}", self.name),
        }
    }

    /// Like [`Proc::line`] but returns the failure instead of panicking.
    pub fn try_line(&self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return Ok(rest.trim().to_string());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("timed out after {timeout:?}"));
                }
                Err(RecvTimeoutError::Disconnected) => return Err("output ended".into()),
            }
        }
    }

    /// Closes the child's stdin (the holder worker releases and exits on that).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)
            .unwrap_or_else(|e| panic!("{}: kill {sig}: {e}", self.name));
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait for a killed child")
    }

    /// Waits for the child to exit by itself, at most `timeout`; panics (after killing it) if it
    /// does not.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            if Instant::now() >= end {
                self.kill();
                panic!("{}: did not exit within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// State letter and start time of a process, from /proc (read independently of the library).
pub fn proc_state(pid: i32) -> Option<(char, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.first()?.chars().next()?, f.get(19)?.parse().ok()?))
}

/// Whether the process recorded as (pid, start) still runs (exists, same start, not a zombie).
pub fn proc_alive(pid: i32, start: u64) -> bool {
    matches!(proc_state(pid), Some((s, st)) if st == start && !matches!(s, 'Z' | 'X' | 'x'))
}

/// A PID that certainly named a process a moment ago and now names none (a reaped child).
pub fn dead_pid() -> i32 {
    let mut c = Command::new("true").spawn().expect("spawn true");
    let pid = c.id() as i32;
    c.wait().expect("wait true");
    pid
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
        },
        ended: None,
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

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// If this process is a worker in one of the shared roles, runs it and exits; otherwise returns.
///
/// Roles:
/// - `holder`: takes the lease at `LH_LOCK` (TTL `LH_TTL_MS`, heartbeat `LH_HB_MS`, identity
///   host/boot/namespace overridden by `LH_HOST`/`LH_BOOT`/`LH_NS`, wall clock skewed by
///   `LH_SKEW_S` seconds, negative = behind), prints `READY token lease_id pid`, prints
///   `LOST reason` if the guard is lost, and on stdin EOF prints `SEQ n lost` and releases.
/// - `oneshot`: one `try_acquire` on `LH_LOCK`, prints `OUTCOME acquired TOKEN`,
///   `OUTCOME wouldblock VERDICT` or `OUTCOME error ERROR`, releases, exits 0.
pub fn common_worker() {
    let Some(role) = role() else { return };
    match role.as_str() {
        "holder" => holder_worker(),
        "oneshot" => oneshot_worker(),
        _ => {}
    }
}

fn holder_worker() -> ! {
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
            std::process::exit(2);
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
    std::process::exit(0);
}

fn oneshot_worker() -> ! {
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
    std::process::exit(0);
}

/// Spawns a `holder` worker for `test` on `lock` and waits for its `READY` line.
/// Returns the child and (token, lease_id).
pub fn spawn_holder(
    test: &str,
    lock: &Path,
    ttl: Duration,
    extra: &[(&str, String)],
) -> (Proc, u64, String) {
    let mut cmd = worker(test, "holder");
    cmd.env("LH_LOCK", lock)
        .env("LH_TTL_MS", ttl.as_millis().to_string());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let p = Proc::spawn(cmd, "holder");
    let ready = p.line("READY", Duration::from_secs(20));
    let mut it = ready.split_whitespace();
    let token = it.next().expect("token").parse().expect("token number");
    let id = it.next().expect("lease id").to_string();
    (p, token, id)
}

// ---------------------------------------------------------------------------------------------
// The mutual-exclusion worker (core_exclusion*.rs).

/// Names inside the exclusion test's directory.
pub struct CsFiles {
    pub lock: PathBuf,
    pub marker: PathBuf,
    pub log: PathBuf,
}

impl CsFiles {
    pub fn new(dir: &Path) -> CsFiles {
        CsFiles {
            lock: dir.join("cs.lock"),
            marker: dir.join("in-critical-section"),
            log: dir.join("cs.log"),
        }
    }
}

/// Runs the `exclusion` worker and exits: loops acquiring the lease at `LH_DIR/cs.lock` (TTL
/// `LH_TTL_MS`) until `LH_TARGET` critical sections are logged in total.
///
/// The critical section creates a marker file with `create_new` (O_EXCL) holding
/// `pid start token`, appends `T token pid micros` to the log, and removes the marker after
/// checking it is still its own. A marker left by a holder that was SIGKILLed inside its
/// critical section is recognised (its process is dead or a zombie), logged as `R`, and
/// replaced; a marker whose owner is alive is an overlap, logged as `O` (exit 4). A guard lost
/// during the critical section is logged as `L`.
pub fn exclusion_worker() -> ! {
    let dir = env_path("LH_DIR");
    let f = CsFiles::new(&dir);
    let ttl = env_ms("LH_TTL_MS").expect("LH_TTL_MS");
    let target: usize = std::env::var("LH_TARGET")
        .expect("LH_TARGET")
        .parse()
        .expect("LH_TARGET");
    let hold = env_ms("LH_HOLD_MS").unwrap_or(Duration::ZERO);
    let me = std::process::id() as i32;
    let my_start = proc_state(me).expect("own stat").1;
    let overlap = |what: String| -> ! {
        append_line(&f.log, &format!("O {what}"));
        std::process::exit(4);
    };
    loop {
        let g = match LeaseBuilder::new(&f.lock)
            .ttl(ttl)
            .acquire_timeout(Duration::from_secs(20))
        {
            Ok(g) => g,
            Err(e) => {
                eprintln!("exclusion worker {me}: acquire failed: {e}");
                std::process::exit(3);
            }
        };
        let token = g.token();
        let mine = format!("{me} {my_start} {token}");
        // Enter: the marker must not exist, unless its owner is dead (killed inside its section).
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&f.marker)
        };
        match create() {
            Ok(mut m) => m.write_all(mine.as_bytes()).expect("write marker"),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let aside = dir.join(format!("stale-marker.{me}"));
                if let Err(e) = fs::rename(&f.marker, &aside) {
                    overlap(format!("{me} token {token}: marker vanished under us: {e}"));
                }
                let text = fs::read_to_string(&aside).unwrap_or_default();
                let _ = fs::remove_file(&aside);
                let v: Vec<&str> = text.split_whitespace().collect();
                let (pid, start) = match (v.first(), v.get(1)) {
                    (Some(p), Some(s)) => (p.parse().unwrap_or(0), s.parse().unwrap_or(0)),
                    // A holder killed between create and write leaves an empty marker: it was
                    // created by a process that is gone now; nobody alive writes an empty one
                    // for longer than a write call.
                    _ => (0, 0),
                };
                if pid != 0 && proc_alive(pid, start) {
                    overlap(format!(
                        "{me} token {token} entered while {pid} (marker `{text}`) is alive inside"
                    ));
                }
                append_line(&f.log, &format!("R {text}|{token}"));
                match create() {
                    Ok(mut m) => m.write_all(mine.as_bytes()).expect("write marker"),
                    Err(e) => overlap(format!("{me} token {token}: marker re-created: {e}")),
                }
            }
            Err(e) => panic!("create marker: {e}"),
        }
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
        // Leave: the marker must still be ours.
        let aside = dir.join(format!("leaving-marker.{me}"));
        if let Err(e) = fs::rename(&f.marker, &aside) {
            overlap(format!("{me} token {token}: our marker vanished: {e}"));
        }
        let text = fs::read_to_string(&aside).unwrap_or_default();
        fs::remove_file(&aside).expect("remove marker");
        if text != mine {
            overlap(format!(
                "{me} token {token}: our marker was replaced by `{text}`"
            ));
        }
        if let Err(e) = g.release() {
            eprintln!("exclusion worker {me}: release failed: {e}");
            std::process::exit(5);
        }
        if finished {
            std::process::exit(0);
        }
    }
}

/// What the exclusion log says.
#[derive(Debug, Default)]
pub struct CsReport {
    /// `(token, pid, micros)` of every critical section, in log order.
    pub entries: Vec<(u64, i32, u128)>,
    /// Markers of holders killed inside their critical section, found by the next holder.
    pub recovered: usize,
    /// Overlaps detected (must be none).
    pub overlaps: Vec<String>,
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
            } else if l.starts_with("R ") {
                r.recovered += 1;
            } else if let Some(rest) = l.strip_prefix("O ") {
                r.overlaps.push(rest.to_string());
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

    /// The longest time between two consecutive critical sections.
    pub fn worst_gap(&self) -> Duration {
        self.entries
            .windows(2)
            .map(|w| Duration::from_micros(w[1].2.saturating_sub(w[0].2) as u64))
            .max()
            .unwrap_or_default()
    }
}
