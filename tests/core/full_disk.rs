//! A full file system does not cost a holder its lease. Needs root (mounts a tmpfs); skips with
//! a printed reason otherwise, and fails under CI.
//!
//! On a 512 KiB tmpfs filled to 0 bytes free with `dd`: a held lease (TTL 300 ms) keeps renewing
//! for more than 3 TTLs (its heartbeat sequence moves on disk, the guard is not lost); a new
//! acquisition of another LOCK in the same directory fails with a clear no-space error and leaves
//! no temp file; releasing on the full disk either writes the released record or marks it
//! released in place, so that contenders judge the lock free.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::{LeaseBuilder, State};

/// A mounted tmpfs, unmounted on drop (lazily if need be).
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount tmpfs: {st}");
        Mount(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn avail(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    s.blocks_available() as u64 * s.fragment_size() as u64
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect()
}

#[test]
fn lease_keeps_renewing_on_a_full_file_system() {
    if crate::support::need_root() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let mnt = Mount::tmpfs(base.path(), "512k");
    let dir = mnt.0.clone();
    let lock = dir.join("full.lock");
    let ttl = Duration::from_millis(300);
    let g = LeaseBuilder::new(&lock).ttl(ttl).try_acquire().unwrap();
    // dd's "No space left on device" is the expected end: checked here, not printed (a passing
    // run shows nothing that reads like a failure).
    let out = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k", "status=none"])
        .arg(format!("of={}", dir.join("FILL").display()))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("No space left on device"),
        "dd should stop on ENOSPC: {}: {err}",
        out.status
    );
    assert_eq!(avail(&dir), 0, "the file system is not full");
    // Renewals need no new blocks: the heartbeat keeps moving on disk for more than 3 TTLs.
    let seq_on_disk = || {
        leasehold::status(&lock)
            .unwrap()
            .lease
            .unwrap()
            .heartbeat_seq
    };
    let full_at = Instant::now();
    let seq0 = seq_on_disk();
    let mut last = seq0;
    let mut checks = 0;
    while full_at.elapsed() < ttl * 4 {
        std::thread::sleep(ttl / 2);
        let v = leasehold::status(&lock).unwrap();
        assert_eq!(v.state, State::Held, "{v}");
        let seq = v.lease.unwrap().heartbeat_seq;
        assert!(
            seq > last,
            "heartbeat stuck at {seq} on the full disk after {:?}",
            full_at.elapsed()
        );
        assert!(!g.is_lost(), "guard lost on the full disk: {:?}", g.loss());
        last = seq;
        checks += 1;
    }
    assert_eq!(avail(&dir), 0);
    eprintln!(
        "full fs: renewed {} times in {:?} ({} TTLs) with 0 bytes free, checked {checks} times, guard not lost",
        last - seq0,
        full_at.elapsed(),
        full_at.elapsed().as_millis() / ttl.as_millis()
    );

    // A new acquisition in the same directory fails clearly, and leaves no temp file.
    let other = dir.join("other.lock");
    let e = LeaseBuilder::new(&other)
        .ttl(ttl)
        .try_acquire()
        .unwrap_err();
    eprintln!(
        "full fs: new acquisition: {e} (exit code {})",
        leasehold_cli::exit_code(&e)
    );
    assert!(e.is_no_space(), "not a no-space error: {e:?}");
    assert_eq!(leasehold_cli::exit_code(&e), leasehold_cli::exit::CANTCREAT);
    assert!(
        e.to_string().contains("other.lock"),
        "error should name the path: {e}"
    );
    assert!(
        leftovers(&dir).is_empty(),
        "temp files left: {:?}",
        leftovers(&dir)
    );
    assert!(!other.exists() || std::fs::metadata(&other).unwrap().len() == 0);

    // Release on the full disk: released record or marked released in place; judged free.
    let token = g.token();
    let r = g.release();
    eprintln!("full fs: release: {r:?}");
    if let Err(e) = &r {
        assert!(
            e.to_string().contains("released in place"),
            "release neither wrote nor marked: {e}"
        );
    }
    let v = leasehold::status(&lock).unwrap();
    eprintln!("full fs: after release: {v}");
    assert_eq!(v.state, State::Free, "{v}");
    let l = v.lease.expect("the released record is still there");
    assert_eq!(l.token, token, "token kept");
    assert!(
        leftovers(&dir).is_empty(),
        "temp files left: {:?}",
        leftovers(&dir)
    );

    // Once space is back, the next holder takes it with a greater token.
    std::fs::remove_file(dir.join("FILL")).unwrap();
    let g = LeaseBuilder::new(&lock).ttl(ttl).try_acquire().unwrap();
    assert!(g.token() > token);
    g.release().unwrap();
    drop(mnt);
}
