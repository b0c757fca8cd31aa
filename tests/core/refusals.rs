//! Refusals: a LOCK that is not a leasehold lease — other text, binary
//! data, a symlink to another file, a directory, a FIFO, a lease of a newer format — is refused
//! by `try_acquire` (and by `status` and `break_lease`) with `NotALease`/`NewerFormat` (exit code
//! 65) naming the path, without hanging on the FIFO, and is left byte-for-byte untouched
//! (contents, link target, target contents, directory listing, file type, mtime).

use crate::support;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::bounded;
use leasehold::{BreakMode, Error, LeaseBuilder};

/// How long a call may take before it counts as hung (an open of a FIFO blocks).
const LIMIT: Duration = Duration::from_secs(5);

/// Everything we can observe of LOCK (without following it) and of what it points to.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    kind: String,
    mode: u32,
    ino: u64,
    mtime_ns: (i64, i64),
    bytes: Option<Vec<u8>>,
    link: Option<PathBuf>,
    target: Option<Vec<u8>>,
    listing: Option<Vec<String>>,
}

fn snapshot(p: &Path) -> Snapshot {
    let m = std::fs::symlink_metadata(p).unwrap();
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_fifo() {
        "fifo"
    } else {
        "file"
    };
    Snapshot {
        kind: kind.into(),
        mode: m.mode(),
        ino: m.ino(),
        mtime_ns: (m.mtime(), m.mtime_nsec()),
        bytes: ft.is_file().then(|| std::fs::read(p).unwrap()),
        link: ft.is_symlink().then(|| std::fs::read_link(p).unwrap()),
        target: ft.is_symlink().then(|| std::fs::read(p).ok()).flatten(),
        listing: ft.is_dir().then(|| {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }),
    }
}

/// Makes one kind of non-lease at the path given.
type Maker = Box<dyn Fn(&Path)>;

#[test]
fn non_leases_at_lock_are_refused_and_left_untouched() {
    let dir = support::tempdir();
    let d = dir.path();
    let target = d.join("precious.txt");
    std::fs::write(&target, b"do not touch\n").unwrap();
    let make: Vec<(&str, Maker)> = vec![
        (
            "pid file",
            Box::new(|p: &Path| std::fs::write(p, b"4242\n").unwrap()),
        ),
        (
            "binary",
            Box::new(|p: &Path| std::fs::write(p, [0u8, 159, 146, 150, 7]).unwrap()),
        ),
        (
            "other json",
            Box::new(|p: &Path| std::fs::write(p, br#"{"pid": 4242}"#).unwrap()),
        ),
        ("symlink", {
            let t = target.clone();
            Box::new(move |p: &Path| std::os::unix::fs::symlink(&t, p).unwrap())
        }),
        (
            "dangling symlink",
            Box::new(|p: &Path| {
                std::os::unix::fs::symlink("/nonexistent/leasehold-test", p).unwrap()
            }),
        ),
        (
            "directory",
            Box::new(|p: &Path| {
                std::fs::create_dir(p).unwrap();
                std::fs::write(p.join("inside"), b"x").unwrap();
            }),
        ),
        (
            "fifo",
            Box::new(|p: &Path| {
                nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
            }),
        ),
        (
            "newer format",
            Box::new(|p: &Path| {
                std::fs::write(p, br#"{"leasehold": 99, "state": "held"}"#).unwrap()
            }),
        ),
    ];
    let target_before = std::fs::read(&target).unwrap();
    for (i, (name, mk)) in make.iter().enumerate() {
        let lock = d.join(format!("lock{i}"));
        mk(&lock);
        let before = snapshot(&lock);
        let l = lock.clone();
        let e = bounded(name, LIMIT, move || {
            LeaseBuilder::new(&l).try_acquire().map(|g| g.token())
        })
        .expect_err(name);
        eprintln!(
            "refusal ({name}): {e} (exit code {})",
            leasehold_cli::exit_code(&e)
        );
        match (&e, *name) {
            (Error::NewerFormat { found: 99, .. }, "newer format") => {}
            (Error::NotALease { .. }, n) if n != "newer format" => {}
            _ => panic!("{name}: wrong error: {e:?}"),
        }
        assert_eq!(leasehold_cli::exit_code(&e), 65, "{name}");
        assert!(
            e.to_string().contains(&format!("lock{i}")),
            "{name}: error must name the path: {e}"
        );
        let l = lock.clone();
        let s = bounded(name, LIMIT, move || leasehold::status(&l).map(|v| v.state));
        assert!(s.is_err(), "{name}: status judged it: {s:?}");
        let l = lock.clone();
        let b = bounded(name, LIMIT, move || {
            leasehold::break_lease(&l, BreakMode::Force).map(|b| b.was_live)
        });
        assert!(b.is_err(), "{name}: break_lease broke it: {b:?}");
        assert_eq!(snapshot(&lock), before, "{name}: LOCK was modified");
    }
    assert_eq!(
        std::fs::read(&target).unwrap(),
        target_before,
        "the symlink's target was modified"
    );
}
