//! "Other hosts": a holder in its own UTS + PID + mount namespaces (`unshare --kill-child`),
//! with its own host name, its own /dev/shm and /proc, sharing the lock directory, running the
//! real `leasehold run`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{self, Proc};

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
