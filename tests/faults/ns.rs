//! "Other hosts": a holder in its own UTS + PID + mount namespaces (`unshare --kill-child`),
//! with its own host name, its own /dev/shm and /proc, sharing the lock directory, running the
//! real `leasehold run`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, LastChange, Proc};

pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Where libfaketime lives on this machine, if installed.
pub fn libfaketime() -> Option<PathBuf> {
    [
        LIBFAKETIME,
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

pub struct Foreign {
    pub kid: Proc,
    /// The PID the holder has inside its namespace.
    pub inner_pid: i32,
    pub host: String,
}

/// What the foreign holder runs.
pub struct Spec<'a> {
    pub lock: &'a Path,
    pub work: &'a Path,
    pub host: &'a str,
    /// The PID to give the holder inside its namespace (via ns_last_pid).
    pub inner_pid: i32,
    pub ttl_ms: u64,
    /// How long the holder's job runs (it then releases and exits 0).
    pub hold_ms: u64,
    /// e.g. "+10m": run the holder under libfaketime.
    pub faketime: Option<&'a str>,
}

impl<'a> Spec<'a> {
    /// A holder of `host` with a true clock and a PID that no process has here, whose job runs
    /// for 600 s (in effect until the test kills it).
    pub fn new(lock: &'a Path, work: &'a Path, host: &'a str, ttl: Duration) -> Spec<'a> {
        Spec {
            lock,
            work,
            host,
            inner_pid: unused_pid(),
            ttl_ms: ttl.as_millis() as u64,
            hold_ms: 600_000,
            faketime: None,
        }
    }
}

pub fn spawn(spec: &Spec) -> Foreign {
    let ready = spec.work.join(format!("{}.ready", spec.host));
    let _ = std::fs::remove_file(&ready);
    // The holder command: `leasehold run` whose job says "ready" and then runs for hold_ms.
    let holder: Vec<String> = vec![
        support::bin().display().to_string(),
        "run".into(),
        "-q".into(),
        "--ttl".into(),
        format!("{}ms", spec.ttl_ms),
        spec.lock.display().to_string(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "echo $LEASEHOLD_TOKEN > {r}.part && mv {r}.part {r} && sleep {s}",
            r = ready.display(),
            s = spec.hold_ms as f64 / 1000.0
        ),
    ];
    let mut preload = String::new();
    if let Some(ft) = spec.faketime {
        let lib = libfaketime().expect("libfaketime");
        preload = format!(
            "export LD_PRELOAD={} FAKETIME={ft} FAKETIME_DONT_FAKE_MONOTONIC=1; ",
            lib.display()
        );
    }
    // Inside: set the host name, a private /dev/shm (libfaketime's semaphores), then make the
    // next forked PID the chosen one and fork the holder (not exec: `; exit $?` keeps sh from
    // exec'ing its last command).
    let script = format!(
        "hostname {host} && mount -t tmpfs tmpfs /dev/shm && echo {prev} > /proc/sys/kernel/ns_last_pid && {preload}\"$@\"; exit $?",
        host = spec.host,
        prev = spec.inner_pid - 1,
    );
    let mut c = Command::new("unshare");
    c.args([
        "--uts",
        "--pid",
        "--fork",
        "--mount",
        "--mount-proc",
        "--kill-child",
        "sh",
        "-c",
        &script,
        "sh",
    ])
    .args(&holder)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut kid = Proc::spawn(&mut c, &format!("foreign holder {}", spec.host));
    let ok = support::wait_until(Duration::from_secs(10), || {
        ready.exists() || kid.try_wait().is_some()
    });
    if !ok || kid.try_wait().is_some() {
        kid.kill();
        let err = kid.stderr();
        panic!("foreign holder {} never got the lock: {err}", spec.host);
    }
    Foreign {
        kid,
        inner_pid: spec.inner_pid,
        host: spec.host.to_string(),
    }
}

/// A PID that no process has outside (nor is likely to get during the test).
pub fn unused_pid() -> i32 {
    let max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    let mut rng = support::Rng::new("unused pid");
    loop {
        let p = (max / 2) + rng.below((max / 2 - 10) as u64) as i32;
        if !Path::new(&format!("/proc/{p}")).exists() {
            return p;
        }
    }
}

/// Checks the lease now in LOCK was written by the foreign holder as planned.
pub fn check_lease_is_foreign(lock: &Path, f: &Foreign) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(lock).expect("read LOCK")).expect("LOCK is JSON");
    assert_eq!(v["holder"]["host"], f.host.as_str(), "{v}");
    assert_eq!(
        v["holder"]["pid"].as_i64(),
        Some(i64::from(f.inner_pid)),
        "the foreign holder did not get the planned PID: {v}"
    );
    let me = leasehold::Identity::current();
    assert_ne!(v["holder"]["pid_ns"].as_u64(), Some(me.pid_ns), "{v}");
    v
}

/// An in-process one-shot contender (true clock) for LOCK with `ttl`.
pub fn contender(lock: &Path, ttl: Duration) -> leasehold::Result<leasehold::LeaseGuard> {
    leasehold::LeaseBuilder::new(lock).ttl(ttl).try_acquire()
}

/// Contends for LOCK with [`contender`] every 2 ms for `dur`, noting each change of its lease in
/// `seen`: every attempt must be refused (a live holder is never broken). Returns the number of
/// attempts. `what` names the case in a failure.
pub fn never_broken(
    lock: &Path,
    ttl: Duration,
    dur: Duration,
    seen: &mut LastChange,
    what: &str,
) -> u64 {
    let end = Instant::now() + dur;
    let mut n = 0;
    while Instant::now() < end {
        seen.poll();
        match contender(lock, ttl) {
            Err(leasehold::Error::WouldBlock { .. }) => {}
            Ok(_) => panic!("{what}: a live holder was broken"),
            Err(e) => panic!("{what}: {e}"),
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    n
}

/// Contends for LOCK with [`contender`] every 2 ms, noting each change of its lease in `seen`,
/// until it takes the lease of a holder killed at `killed`: the new guard. Fails (naming `what`)
/// unless that happens within TTL + 1 s of the kill, or on any error but "held".
pub fn take_over(
    lock: &Path,
    ttl: Duration,
    killed: Instant,
    seen: &mut LastChange,
    what: &str,
) -> leasehold::LeaseGuard {
    loop {
        seen.poll();
        match contender(lock, ttl) {
            Ok(g) => return g,
            Err(leasehold::Error::WouldBlock { .. }) => {}
            Err(e) => panic!("{what}: contender: {e}"),
        }
        assert!(
            killed.elapsed() <= ttl + Duration::from_secs(1),
            "{what}: eternal lock: a dead foreign holder was not taken over within TTL + 1 s \
             of the kill"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
