//! The mutex file deleted during transitions by another user (PROTOCOL §10): in a directory
//! everyone may write (not sticky), `nobody` runs an inotify-driven deleter — every event in
//! the directory (a contender opening, reading or renaming anything) makes it unlink the mutex
//! file at once, so the deletion lands inside critical sections — while four root processes
//! take the lease in a loop on a disk, each section checked by the one critical-section checker. With
//! the mutex alone, a contender inside through the deleted file and one inside through its
//! successor both took the lease (about 1 % of transitions); the announcement on LOCK's
//! directory (`klock::announce`), which a directory writer cannot delete, keeps them apart. The
//! same as root in a sticky directory whose mutex file `nobody` created first and keeps
//! deleting and putting back.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{CsFiles, CsReport, Proc};

const WORKERS: usize = 4;

/// The deleter: `python3 - DIR NAME COUNTS`. Python's own inotify through libc: it is the one
/// interpreter every test machine has, and it runs as `nobody` from /usr, which the test
/// binary's directory may not let `nobody` reach.
const DELETER: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d, name, counts = sys.argv[1], sys.argv[2], sys.argv[3]
# "recreate": put a file of our own back at once (O_EXCL), as in a sticky directory, where only
# the file's owner may delete it: the attacker keeps owning the mutex while it wins the race.
# Its bytes are a real mutex file's of this lock (argv[5]): an empty one is refused.
recreate = len(sys.argv) > 5 and sys.argv[4] == "recreate"
template = open(sys.argv[5], "rb").read() if recreate else b""
fd = libc.inotify_init()
if fd < 0 or libc.inotify_add_watch(fd, d.encode(), 0xFFF) < 0:
    sys.exit("inotify: errno %d" % ctypes.get_errno())
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
n = 0
print("watching", flush=True)
import random, time
while True:
    os.read(fd, 65536)
    try:
        os.unlink(name, dir_fd=dfd)
        n += 1
        if recreate:
            try:
                fd2 = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666, dir_fd=dfd)
                os.write(fd2, template)
                os.close(fd2)
            except FileExistsError:
                pass
        if n < 20 or n % 20 == 0:
            with open(counts, "w") as f:
                f.write(str(n))
        # Now and then, not always: a deleter that deletes every new file at once only keeps
        # everyone out (denial of service, which it may); one that lets transitions through
        # hits them in the middle.
        time.sleep(random.random() * 0.004)
    except (FileNotFoundError, PermissionError):
        # Gone already, or (sticky directory) now root's: the attack waits for another chance.
        pass
"#;

#[test]
fn a_mutex_file_another_user_keeps_deleting_never_lets_two_transitions_overlap() {
    deleter_trial(Shared::Everyone);
}

/// As root in a sticky directory (a `/tmp`) whose mutex file `nobody` created before any
/// contender came: `nobody` may delete its own file there and puts a new one of its own back at
/// once, so root's contenders keep meeting a mutex file another user owns and deletes.
#[test]
fn root_in_a_sticky_directory_with_a_mutex_another_user_precreated_and_deletes_never_overlaps() {
    deleter_trial(Shared::StickyPrecreated);
}

/// How the attacked directory is shared.
#[derive(Clone, Copy, PartialEq)]
enum Shared {
    /// Mode 0777, not sticky: anyone may delete any file.
    Everyone,
    /// Mode 1777 (sticky), the mutex file created by `nobody` before the first contender.
    StickyPrecreated,
}

fn deleter_trial(shared: Shared) {
    if support::skip(
        !support::is_root(),
        "the deleter runs as another user (nobody): needs root",
    ) || support::need_tools(&["python3"])
    {
        return;
    }
    // On a disk (ext4 here), not tmpfs: a take there syncs its lease inside the section, which
    // leaves the deleter time to strike while a contender is inside.
    let top = tempfile::Builder::new()
        .prefix("leasehold-deleter-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = top.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    let mode = match shared {
        Shared::Everyone => 0o777,
        Shared::StickyPrecreated => 0o1777,
    };
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    let files = CsFiles::new(&dir);
    let name = format!(
        ".{}.leasehold-mutex",
        files.lock.file_name().unwrap().to_str().unwrap()
    );
    // A real mutex file of a lock of this name, made by root elsewhere: what `nobody` writes
    // into the mutex files it plants (leasehold refuses an empty one).
    let template = top.path().join("template");
    {
        let scratch = top.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        let lock = scratch.join(files.lock.file_name().unwrap());
        let st = support::cli::lh()
            .args(["run", "-n"])
            .arg(&lock)
            .args(["--", "true"])
            .status()
            .unwrap();
        assert!(
            st.success(),
            "a run to make the template mutex file failed: {st}"
        );
        std::fs::copy(scratch.join(&name), &template).unwrap();
        std::fs::set_permissions(&template, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let counts = top.path().join("deletions");
    std::fs::write(&counts, "0").unwrap();
    std::fs::set_permissions(&counts, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut deleter = Command::new("python3");
    deleter
        .args(["-I", "-S", "-c", DELETER])
        .arg(&dir)
        .arg(&name)
        .arg(&counts)
        .arg(match shared {
            Shared::Everyone => "delete",
            Shared::StickyPrecreated => "recreate",
        })
        .arg(&template)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null());
    let deleter = Proc::spawn_piped(deleter, "mutex deleter (nobody)");
    deleter.line("watching", Duration::from_secs(10));
    let target = support::scaled(1_000).max(200);
    // In a sticky directory the attack lasts only while `nobody` wins each race to put its file
    // back: once a root contender has created the mutex file, `nobody` can no longer delete
    // it. So the transitions come in batches, each starting from a mutex file `nobody` planted
    // (the test, between batches, with no contender running, removes root's).
    let batches = match shared {
        Shared::Everyone => 1,
        Shared::StickyPrecreated => 20,
    };
    let started = Instant::now();
    for batch in 1..=batches {
        if shared == Shared::StickyPrecreated {
            plant(&dir, &name, &template);
        }
        let upto = target * batch / batches;
        let mut workers: Vec<Proc> = (0..WORKERS)
            .map(|i| {
                let mut c = support::worker::cmd("exclusion");
                c.env("LH_DIR", &dir)
                    .env("LH_TTL_MS", "2000")
                    .env("LH_TARGET", upto.to_string())
                    .env("LH_NAME", format!("b{batch}w{i}"));
                Proc::spawn_piped(c, &format!("exclusion worker {i}"))
            })
            .collect();
        for w in &mut workers {
            let st = w.wait_timeout(Duration::from_secs(300));
            assert!(st.success(), "a worker failed: {st}: {}", w.stderr());
        }
    }
    let deletions: u64 = std::fs::read_to_string(&counts)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(deleter);
    let r = CsReport::read(&files.log);
    let sections = files.checker().verify();
    println!(
        "{} transitions by {WORKERS} processes in {:.1?} while nobody deleted the mutex file \
         {deletions}+ times; checked sections {}, token regressions {}",
        r.entries.len(),
        started.elapsed(),
        sections.len(),
        r.token_regressions().len()
    );
    let least = match shared {
        Shared::Everyone => 100,
        Shared::StickyPrecreated => batches as u64,
    };
    assert!(
        deletions >= least,
        "the attack did not happen: the mutex file was deleted only {deletions} times"
    );
    assert!(sections.len() >= target, "only {} sections", sections.len());
    r.assert_sound(target);
}

/// Puts a mutex file of `nobody`'s (the bytes of `template`) at `name` in the sticky `dir`,
/// removing whatever is there first (no contender runs meanwhile), and checks the scene.
fn plant(dir: &std::path::Path, name: &str, template: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let at = dir.join(name);
    match std::fs::remove_file(&at) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot remove {}: {e}", at.display()),
    }
    let made = Command::new("sh")
        .args(["-c", "umask 0; cat \"$2\" > \"$1\"", "sh"])
        .arg(&at)
        .arg(template)
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert!(made.success(), "nobody could not plant the mutex file");
    // The deleter, woken by the planting, may be between its unlink and its new file.
    let since = Instant::now();
    let meta = loop {
        match std::fs::metadata(&at) {
            Ok(m) => break m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                assert!(
                    since.elapsed() < Duration::from_secs(5),
                    "the planted file is gone"
                );
                std::thread::yield_now();
            }
            Err(e) => panic!("cannot stat {}: {e}", at.display()),
        }
    };
    assert_eq!(meta.uid(), 65534, "the planted mutex file is not nobody's");
    assert_eq!(
        std::fs::metadata(dir).unwrap().mode() & 0o1000,
        0o1000,
        "the directory is not sticky"
    );
}
