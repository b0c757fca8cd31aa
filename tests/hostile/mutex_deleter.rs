//! The mutex file deleted during transitions by another user (PROTOCOL §10): in a directory
//! everyone may write (not sticky), `nobody` runs an inotify-driven deleter — every event in
//! the directory (a contender opening, reading or renaming anything) makes it unlink the mutex
//! file at once, so the deletion lands inside critical sections — while four root processes
//! take the lease in a loop on a disk, each section checked by the one critical-section checker. With
//! the mutex alone, a contender inside through the deleted file and one inside through its
//! successor both took the lease (about 1 % of transitions); the announcement on LOCK's
//! directory (`klock::announce`), which a directory writer cannot delete, keeps them apart.

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
        if n % 20 == 0:
            with open(counts, "w") as f:
                f.write(str(n))
        # Now and then, not always: a deleter that deletes every new file at once only keeps
        # everyone out (denial of service, which it may); one that lets transitions through
        # hits them in the middle.
        time.sleep(random.random() * 0.004)
    except FileNotFoundError:
        pass
"#;

#[test]
fn a_mutex_file_another_user_keeps_deleting_never_lets_two_transitions_overlap() {
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
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let files = CsFiles::new(&dir);
    let name = format!(
        ".{}.leasehold-mutex",
        files.lock.file_name().unwrap().to_str().unwrap()
    );
    let counts = top.path().join("deletions");
    std::fs::write(&counts, "0").unwrap();
    std::fs::set_permissions(&counts, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut deleter = Command::new("python3");
    deleter
        .args(["-I", "-S", "-c", DELETER])
        .arg(&dir)
        .arg(&name)
        .arg(&counts)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null());
    let deleter = Proc::spawn_piped(deleter, "mutex deleter (nobody)");
    deleter.line("watching", Duration::from_secs(10));
    let target = support::scaled(1_000).max(200);
    let started = Instant::now();
    let mut workers: Vec<Proc> = (0..WORKERS)
        .map(|i| {
            let mut c = support::worker::cmd("exclusion");
            c.env("LH_DIR", &dir)
                .env("LH_TTL_MS", "2000")
                .env("LH_TARGET", target.to_string())
                .env("LH_NAME", format!("w{i}"));
            Proc::spawn_piped(c, &format!("exclusion worker {i}"))
        })
        .collect();
    for w in &mut workers {
        let st = w.wait_timeout(Duration::from_secs(300));
        assert!(st.success(), "a worker failed: {st}: {}", w.stderr());
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
    assert!(
        deletions >= 100,
        "the attack did not happen: the mutex file was deleted only {deletions} times"
    );
    assert!(sections.len() >= target, "only {} sections", sections.len());
    r.assert_sound(target);
}
