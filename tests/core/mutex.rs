//! The internal mutex never becomes an eternal lock: a process that takes it and freezes
//! (SIGSTOP) is judged like a hung holder after a TTL — named by /proc/locks, verified, and
//! SIGKILLed — while a caller with a deadline is never held past it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::LeaseBuilder;

/// A child killed and reaped on drop, so a failing test leaves no stopped process behind.
struct Frozen(std::process::Child);

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a python process that takes the mutex of `lock` (made by a first acquisition: an
/// empty file at the mutex name is not leasehold's) and stops itself.
#[allow(clippy::zombie_processes)] // reaped by `Frozen`'s Drop
fn frozen_mutex_holder(lock: &std::path::Path) -> Frozen {
    LeaseBuilder::new(lock)
        .try_acquire()
        .and_then(|g| g.release())
        .expect("a first acquisition makes the mutex file");
    let mutex = lock.with_file_name(format!(
        ".{}.leasehold-mutex",
        lock.file_name().unwrap().to_str().unwrap()
    ));
    let child = Command::new("python3")
        .arg("-c")
        .arg(
            "import fcntl,os,signal,sys\n\
             f=open(sys.argv[1],'a+')\n\
             fcntl.flock(f, fcntl.LOCK_EX)\n\
             os.kill(os.getpid(), signal.SIGSTOP)\n",
        )
        .arg(&mutex)
        .stdin(Stdio::null())
        .spawn()
        .expect("python3");
    // Wait until it has stopped itself while holding the lock.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let state = stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap();
        if state == 'T' {
            return Frozen(child);
        }
        assert!(Instant::now() < end, "python never stopped itself");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_frozen_mutex_holder_is_killed_after_a_ttl() {
    if crate::support::need_tools(&["python3"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("m.lock");
    let mut frozen = frozen_mutex_holder(&lock);
    let ttl = Duration::from_millis(300);
    let t0 = Instant::now();
    let g = LeaseBuilder::new(&lock)
        .ttl(ttl)
        .acquire_timeout(Duration::from_secs(10))
        .expect("the frozen mutex holder should have been judged and stopped");
    let took = t0.elapsed();
    eprintln!("mutex: frozen holder stopped and lease taken after {took:?} (TTL {ttl:?})");
    assert!(took >= ttl, "judged before a TTL: {took:?}");
    let status = frozen.0.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}"
    );
    g.release().unwrap();
}

#[test]
fn a_deadline_is_kept_while_the_mutex_is_stuck() {
    if crate::support::need_tools(&["python3"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("d.lock");
    let frozen = frozen_mutex_holder(&lock);
    let t0 = Instant::now();
    // A long TTL: the holder is not yet judged, so only the deadline ends the wait.
    let err = LeaseBuilder::new(&lock)
        .ttl(Duration::from_secs(30))
        .take_over_hung(false)
        .acquire_timeout(Duration::from_millis(300))
        .unwrap_err();
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(800), "{took:?}");
    assert_eq!(leasehold_cli::exit_code(&err), 75, "{err}");
    assert!(err.to_string().contains("pid"), "names the holder: {err}");
    // try_acquire (-n) is bounded too.
    let t0 = Instant::now();
    assert!(LeaseBuilder::new(&lock).try_acquire().is_err());
    assert!(t0.elapsed() < Duration::from_secs(1));
    drop(frozen);
}
