//! `leasehold run` beside util-linux flock(1) (and the flock drop-in, which by default is
//! flock(1) exactly) on the same file: leasehold never takes a lease while another program holds
//! a kernel lock on LOCK itself — `run -n` exits 75 naming the holder's pid, a waiting `run`
//! waits and then runs, and `status` reports the lock held by that pid, not free.
//! (The other way round — flock(1) waiting for a leasehold holder — is not done: PROTOCOL §10.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// `FLOCK FILE sh -c 'touch READY; while [ -e RELEASE ]; …'`: a kernel-lock holder that keeps
/// the lock until the test removes RELEASE; returns it once its command runs.
fn kernel_holder(flock: &[&str], file: &Path, dir: &Path) -> Proc {
    let (ready, release) = (dir.join("k.ready"), dir.join("k.release"));
    std::fs::write(&release, "").unwrap();
    let script = format!(
        "touch '{}'; while [ -e '{}' ]; do sleep 0.02; done",
        ready.display(),
        release.display()
    );
    let mut c = Command::new(flock[0]);
    c.args(&flock[1..])
        .arg(file)
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let p = Proc::spawn(c, "kernel-lock holder");
    ensure_within(
        "the kernel-lock holder's command",
        Duration::from_secs(10),
        || ready.exists(),
    );
    p
}

#[test]
fn a_run_never_takes_a_lock_file_that_flock_1_or_the_drop_in_holds() {
    if need_tools(&["flock"]) {
        return;
    }
    let bin = bin();
    let dropin = [bin.to_str().unwrap(), "flock"];
    for (who, flock) in [
        ("util-linux flock(1)", &["flock"][..]),
        ("the drop-in", &dropin[..]),
    ] {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("job.lock");
        // A lock used by leasehold before (a released record), then taken by the other program.
        lh_assert()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "true"])
            .assert()
            .success();
        let mut holder = kernel_holder(flock, &lock, d.path());
        let pid = holder.pid();
        let marker = d.path().join("ran");
        let o = lh()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(75), "{who}: run -n: {err}");
        assert!(
            err.contains(&format!("LOCK itself is locked by pid {pid} ")),
            "{who}: run -n does not name the kernel lock's holder {pid}: {err}"
        );
        assert!(!marker.exists(), "{who}: run -n ran its command");
        let st = lh().args(["status", "--json"]).arg(&lock).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(v["state"], "held", "{who}: status: {v}");
        assert!(
            v["reason"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("pid {pid} ")),
            "{who}: status does not name {pid}: {v}"
        );
        // A waiting run waits for the kernel lock, then runs.
        let mut waiter = Proc::spawn(
            lh().args(["run", "-w", "30s"])
                .arg(&lock)
                .args(["--", "touch"])
                .arg(&marker)
                .stderr(Stdio::piped()),
            "waiting run",
        );
        assert!(
            waiter
                .wait_line(Duration::from_secs(10), |l| l
                    .contains("a kernel lock on LOCK"))
                .is_some(),
            "{who}: the waiter did not say what it waits behind"
        );
        assert!(
            !marker.exists(),
            "{who}: the waiter ran beside the kernel lock's holder"
        );
        std::fs::remove_file(d.path().join("k.release")).unwrap();
        assert!(holder.wait_timeout(Duration::from_secs(10)).success());
        let st = waiter.wait_timeout(Duration::from_secs(10));
        assert!(st.success(), "{who}: the waiter: {st}: {}", waiter.stderr());
        assert!(marker.exists(), "{who}: the waiter never ran");
    }
}
