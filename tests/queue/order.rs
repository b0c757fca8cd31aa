//! Waiting is fair, herd-free and event-driven, proven with real processes:
//! waiters that arrive in a known order acquire in that order; a SIGKILLed waiter in the middle
//! does not stall the queue; a SIGSTOPped one is skipped after a TTL (the head too, whose
//! reserved token must then not be used); waiters kept for longer than a TTL behind a held mutex
//! keep their places; a release wakes only the head; polling mode (`poll(true)`, as on NFS) keeps
//! the order; a timeout is honoured while queued and leaves no ticket behind.
//!
//! Workers are this test binary re-run in the `queue-waiter` role (see `support::worker`): each
//! acquires the lock given in `LH_LOCK`, appends `NAME TOKEN` to `LH_LOG` (or `NAME error CODE`,
//! exiting with CODE, when it could not), and releases when `LH_HOLD_FILE` is absent. The order
//! checks count only waiters that were served: a failed waiter fails the check.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::LeaseBuilder;

use crate::support::{self, Proc};

/// How long a worker may take to finish once it can.
const EXIT: Duration = Duration::from_secs(30);

fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Role `looper`: acquires and releases `LH_LOOPS` times, failing on any acquisition that took
/// longer than a second (a waiter that missed its wake-up sleeps a 5 s tick with a 30 s TTL).
pub fn looper_role() -> i32 {
    let loops: u32 = std::env::var("LH_LOOPS").unwrap().parse().unwrap();
    let lock = PathBuf::from(std::env::var("LH_LOCK").unwrap());
    let mut b = LeaseBuilder::new(&lock)
        .ttl(Duration::from_secs(30))
        .durable(false)
        .acquirer();
    for i in 0..loops {
        let t = Instant::now();
        let g = b.acquire().unwrap();
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "acquisition {i} stalled for {took:?}"
        );
        g.release().unwrap();
    }
    0
}

/// Processes that take the lock again and again (each re-queueing behind the other, ticket names
/// being reused) never stall: a regression test for a waiter that waited on its own ticket.
#[test]
fn back_to_back_acquirers_never_stall() {
    let dir = scratch();
    let lock = dir.path().join("loop.lock");
    let mut w = Workers {
        children: (0..3)
            .map(|i| {
                let mut c = support::worker::cmd("looper");
                c.env("LH_LOOPS", "200")
                    .env("LH_LOCK", &lock)
                    .stdout(std::process::Stdio::null());
                (format!("looper{i}"), Proc::spawn(c, &format!("looper {i}")))
            })
            .collect(),
    };
    for (_, c) in &mut w.children {
        assert!(
            c.wait_timeout(Duration::from_secs(120)).success(),
            "a looper failed (see its output)"
        );
    }
}

/// Role `queue-waiter`: see the module documentation.
pub fn waiter_role() -> i32 {
    let name = std::env::var("LH_WAIT_WORKER").unwrap();
    let lock = PathBuf::from(std::env::var("LH_LOCK").unwrap());
    let log = PathBuf::from(std::env::var("LH_LOG").unwrap());
    let ttl = Duration::from_millis(std::env::var("LH_TTL_MS").unwrap().parse().unwrap());
    let poll = std::env::var("LH_POLL").is_ok();
    let mut b = LeaseBuilder::new(&lock)
        .ttl(ttl)
        .poll(poll)
        .durable(false)
        .command(vec![name.clone()]);
    if let Ok(n) = std::env::var("LH_SLOTS") {
        b = b.slots(n.parse().unwrap());
    }
    let res = match std::env::var("LH_WAIT_MS") {
        Ok(ms) => b.acquire_timeout(Duration::from_millis(ms.parse().unwrap())),
        Err(_) => b.acquire(),
    };
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .unwrap();
    match res {
        Ok(g) => {
            writeln!(f, "{name} {}", g.token()).unwrap();
            drop(f);
            if let Ok(hold) = std::env::var("LH_HOLD_FILE") {
                while Path::new(&hold).exists() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            g.release().unwrap();
            0
        }
        Err(e) => {
            let code = leasehold_cli::exit_code(&e);
            writeln!(f, "{name} error {code}").unwrap();
            eprintln!("queue waiter {name}: {e}");
            code
        }
    }
}

/// Waiters, named, killed and reaped on drop (by [`Proc`]).
struct Workers {
    children: Vec<(String, Proc)>,
}

impl Workers {
    /// Waits for every waiter to exit, and asserts that each succeeded.
    #[track_caller]
    fn all_succeed(&mut self) {
        for (name, c) in &mut self.children {
            assert!(c.wait_timeout(EXIT).success(), "{name} failed");
        }
    }
}

fn spawn(name: &str, lock: &Path, log: &Path, ttl_ms: u64, extra: &[(&str, String)]) -> Proc {
    let mut cmd = support::worker::cmd("queue-waiter");
    cmd.env("LH_WAIT_WORKER", name)
        .env("LH_LOCK", lock)
        .env("LH_LOG", log)
        .env("LH_TTL_MS", ttl_ms.to_string())
        .stdout(std::process::Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    Proc::spawn(cmd, name)
}

/// Waits until `n` live waiters are queued on `lock` (as `status` shows them).
fn wait_queued(lock: &Path, n: usize) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let q = leasehold::status(lock).unwrap().queue;
        if q.len() == n {
            return;
        }
        assert!(
            Instant::now() < end,
            "expected {n} queued, have {}",
            q.len()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn wait_lines(log: &Path, n: usize, secs: u64) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < end,
            "only {} of {n} lines: {lines:?}",
            lines.len()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The names of the served waiters, in log order; panics on a waiter that logged a failure
/// (`NAME error CODE`) or anything else but `NAME TOKEN`.
fn served(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match l.split(' ').collect::<Vec<_>>()[..] {
            [name, token] if token.parse::<u64>().is_ok() => name.to_string(),
            _ => panic!("a waiter was not served: `{l}` (log: {lines:?})"),
        })
        .collect()
}

/// Queues `n` workers one by one behind a held lease, so their arrival order is known.
fn queue_up(lock: &Path, log: &Path, n: usize, ttl_ms: u64, extra: &[(&str, String)]) -> Workers {
    let mut w = Workers { children: vec![] };
    for i in 0..n {
        let name = format!("w{i}");
        w.children
            .push((name.clone(), spawn(&name, lock, log, ttl_ms, extra)));
        wait_queued(lock, i + 1);
    }
    w
}

#[test]
fn waiters_acquire_in_arrival_order() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("fifo.lock"), dir.path().join("log"));
    let holder = held(&lock, Duration::from_secs(10));
    let mut w = queue_up(&lock, &log, 6, 10_000, &[]);
    holder.release().unwrap();
    let lines = wait_lines(&log, 6, 30);
    assert_eq!(served(&lines), ["w0", "w1", "w2", "w3", "w4", "w5"]);
    let tokens = tokens(&lines);
    assert!(tokens.windows(2).all(|p| p[0] < p[1]), "{tokens:?}");
    w.all_succeed();
    assert!(leasehold::status(&lock).unwrap().queue.is_empty());
}

#[test]
fn killed_waiter_in_the_middle_does_not_stall_the_queue() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("kill.lock"), dir.path().join("log"));
    let holder = held(&lock, Duration::from_secs(10));
    let mut w = queue_up(&lock, &log, 5, 10_000, &[]);
    w.children[2].1.kill();
    let t0 = Instant::now();
    holder.release().unwrap();
    let lines = wait_lines(&log, 4, 30);
    // Far less than a TTL (10 s): the kernel freed the dead waiter's ticket lock at once.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(served(&lines), ["w0", "w1", "w3", "w4"]);
    for (name, c) in &mut w.children {
        if name != "w2" {
            assert!(c.wait_timeout(EXIT).success(), "{name} failed");
        }
    }
}

/// Whether `pid` holds a kernel lock on the file at `path` (as /proc/locks says).
fn holds_lock(pid: i32, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::metadata(path) else {
        return false;
    };
    let want = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(m.dev()),
        nix::sys::stat::minor(m.dev()),
        m.ino()
    );
    fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .any(|f| {
            f.get(1) != Some(&"->")
                && f.get(4) == Some(&pid.to_string().as_str())
                && f.get(5) == Some(&want.as_str())
        })
}

/// SIGSTOPs `pid` at a moment it is not inside the lock's mutex: stopped inside it, it would
/// be a stuck mutex holder, which contenders SIGKILL after a TTL (tested in core_mutex).
fn stop_outside_mutex(pid: i32, lock: &Path) {
    let name = lock.file_name().unwrap().to_str().unwrap();
    let mutex = lock.with_file_name(format!(".{name}.leasehold-mutex"));
    let p = nix::unistd::Pid::from_raw(pid);
    for _ in 0..1000 {
        nix::sys::signal::kill(p, nix::sys::signal::SIGSTOP).unwrap();
        // Stopped once /proc says so; only then is the lock table settled for it.
        while !fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap()
            .rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .starts_with('T')
        {
            std::thread::yield_now();
        }
        if !holds_lock(pid, &mutex) {
            return;
        }
        nix::sys::signal::kill(p, nix::sys::signal::SIGCONT).unwrap();
        std::thread::yield_now();
    }
    panic!("pid {pid} never left the mutex");
}

fn tokens(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect()
}

/// A stopped waiter is skipped after a TTL and queues again at the back when resumed. Stopping
/// the head matters on its own: it has reserved the next token while next in line, and the
/// waiter that overtakes it, and the head itself once resumed, must still get greater tokens.
#[test]
fn stopped_waiter_is_skipped_after_a_ttl_and_queues_again_when_resumed() {
    for victim in [1, 0] {
        let dir = scratch();
        let (lock, log) = (dir.path().join("stop.lock"), dir.path().join("log"));
        let ttl_ms = 400;
        let holder = held(&lock, Duration::from_millis(ttl_ms));
        let mut w = queue_up(&lock, &log, 4, ttl_ms, &[]);
        let stopped = w.children[victim].1.pid();
        stop_outside_mutex(stopped, &lock);
        let stopped_at = Instant::now();
        holder.release().unwrap();
        let lines = wait_lines(&log, 3, 30);
        let skipped_after = stopped_at.elapsed();
        let mut expect: Vec<String> = (0..4).map(|i| format!("w{i}")).collect();
        let resumed = expect.remove(victim);
        assert_eq!(served(&lines), expect);
        // Skipped once its ticket's beat has not moved for a TTL. A waiter beats at least every
        // TTL/4 while it waits, so its last beat was at most TTL/4 before the stop: the skip
        // comes at least 3/4 of a TTL after the stop (half a TTL would pass a skip judged
        // after TTL/4 of silence).
        let ttl = Duration::from_millis(ttl_ms);
        assert!(
            skipped_after >= ttl * 3 / 4,
            "skipped {skipped_after:?} after the stop (TTL {ttl:?})"
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(stopped),
            nix::sys::signal::SIGCONT,
        )
        .unwrap();
        let lines = wait_lines(&log, 4, 30);
        assert_eq!(served(&lines)[3], resumed);
        let t = tokens(&lines);
        assert!(
            t.windows(2).all(|p| p[0] < p[1]),
            "tokens must grow in the order the lease was taken: {lines:?}"
        );
        w.all_succeed();
    }
}

/// Waiting for a mutex someone sits on is not being frozen: waiters blocked on it for longer
/// than a TTL keep their tickets' heartbeats moving, and none is skipped when it frees.
#[test]
fn waiters_behind_a_held_mutex_keep_their_places() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("busy.lock"), dir.path().join("log"));
    let ttl_ms = 300;
    let holder = held(&lock, Duration::from_millis(ttl_ms));
    let mut w = queue_up(&lock, &log, 3, ttl_ms, &[]);
    let mutex = dir.path().join(".busy.lock.leasehold-mutex");
    let m = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&mutex)
        .unwrap();
    m.lock().unwrap();
    holder.release().unwrap(); // in place, without the mutex: every waiter now wants it
    std::thread::sleep(Duration::from_millis(ttl_ms * 3));
    m.unlock().unwrap();
    let lines = wait_lines(&log, 3, 30);
    assert_eq!(served(&lines), ["w0", "w1", "w2"]);
    w.all_succeed();
}

/// Voluntary + involuntary context switches of every thread of `pid`.
fn switches(pid: u32) -> u64 {
    let mut total = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let s = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for l in s.lines() {
            if l.starts_with("voluntary_ctxt_switches")
                || l.starts_with("nonvoluntary_ctxt_switches")
            {
                total += l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
            }
        }
    }
    total
}

/// Context switches of each waiter so far (a waiter that wakes switches at least once).
fn switch_counts(w: &Workers) -> Vec<u64> {
    w.children
        .iter()
        .map(|(_, c)| switches(c.child.id()))
        .collect()
}

/// Waits until every waiter is parked in its blocking wait — seen queued is not enough (the
/// last one may still be on its way from its ticket to its wait), so until no waiter has been
/// scheduled for 50 ms — and returns their context-switch counts then.
fn settled(w: &Workers) -> Vec<u64> {
    let mut before = switch_counts(w);
    let settle_end = Instant::now() + Duration::from_secs(10);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = switch_counts(w);
        if now == before {
            return before;
        }
        assert!(Instant::now() < settle_end, "waiters never settled");
        before = now;
    }
}

/// Which waiters ran since `before` (after 50 ms for any herd to show itself), head first.
fn woken_since(w: &Workers, before: &[u64], who: &str) -> Vec<bool> {
    std::thread::sleep(Duration::from_millis(50));
    let after = switch_counts(w);
    let woke: Vec<bool> = before.iter().zip(&after).map(|(b, a)| a > b).collect();
    eprintln!("wait: {who} woken by one release (head first): {woke:?}");
    woke
}

#[test]
fn a_release_wakes_only_the_head() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("herd.lock"), dir.path().join("log"));
    let hold = dir.path().join("hold");
    fs::write(&hold, "").unwrap();
    // A long TTL, so that no waiter's periodic tick falls into the measured window.
    let holder = held(&lock, Duration::from_secs(60));
    let extra = [("LH_HOLD_FILE", hold.display().to_string())];
    let mut w = queue_up(&lock, &log, 5, 60_000, &extra);
    let before = settled(&w);
    holder.release().unwrap();
    // w0 takes the lease and keeps it while `hold` exists.
    let _ = wait_lines(&log, 1, 30);
    let woke = woken_since(&w, &before, "waiters");
    // The head woke and took it; its successor woke once, when the head left the queue, to
    // become the new head. Nobody further back was woken.
    assert!(woke[0], "the head did not wake");
    assert_eq!(&woke[2..], &[false, false, false], "a herd woke: {woke:?}");
    fs::remove_file(&hold).unwrap();
    let lines = wait_lines(&log, 5, 30);
    assert_eq!(served(&lines), ["w0", "w1", "w2", "w3", "w4"]);
    w.all_succeed();
}

#[test]
fn polling_mode_keeps_the_order() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("poll.lock"), dir.path().join("log"));
    let holder = held(&lock, Duration::from_millis(500));
    let extra = [("LH_POLL", "1".to_string())];
    let mut w = queue_up(&lock, &log, 4, 500, &extra);
    holder.release().unwrap();
    let lines = wait_lines(&log, 4, 30);
    assert_eq!(served(&lines), ["w0", "w1", "w2", "w3"]);
    w.all_succeed();
}

#[test]
fn timeout_is_honoured_while_queued_and_leaves_no_ticket() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("wait.lock"), dir.path().join("log"));
    let holder = held(&lock, Duration::from_secs(10));
    let mut w = queue_up(&lock, &log, 2, 10_000, &[]);
    let t0 = Instant::now();
    let mut late = spawn("late", &lock, &log, 10_000, &[("LH_WAIT_MS", "300".into())]);
    let status = late.wait_timeout(EXIT);
    let took = t0.elapsed();
    assert_eq!(
        status.code(),
        Some(75),
        "the late waiter did not time out: {status}"
    );
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("late error 75"), "{text}");
    // 300 ms plus process start-up and one tick; far below the 10 s TTL.
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(leasehold::status(&lock).unwrap().queue.len(), 2);
    // A one-shot caller never overtakes the queue, even when the lease is free for a moment.
    drop(holder);
    let lines = wait_lines(&log, 3, 30);
    assert_eq!(lines[0], "late error 75", "{lines:?}");
    assert_eq!(served(&lines[1..]), ["w0", "w1"]);
    w.all_succeed();
}

/// The queue directory's entries: tickets (`q-N`) and prepared leases (`q-N.lease`).
fn queue_files(lock: &Path) -> Vec<String> {
    let q = lock.with_file_name(format!(
        ".{}.leasehold-queue",
        lock.file_name().unwrap().to_str().unwrap()
    ));
    let mut v: Vec<String> = fs::read_dir(q)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn ino(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(p).unwrap().ino()
}

/// On a local file system the head writes its lease ahead of time beside its ticket and takes
/// the lease by renaming that very file over LOCK, woken by its holder's release in place (the
/// released bit) long before any tick; nothing is left in the queue.
#[test]
fn the_head_takes_the_lease_it_prepared_when_woken_by_the_release() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("prep.lock"), dir.path().join("log"));
    let hold = dir.path().join("hold");
    fs::write(&hold, "").unwrap();
    // A long TTL: the tick is 5 s, so a take within 2.5 s was woken by the release.
    let holder = held(&lock, Duration::from_secs(60));
    let extra = [("LH_HOLD_FILE", hold.display().to_string())];
    let mut w = queue_up(&lock, &log, 1, 60_000, &extra);
    let mut files = Vec::new();
    assert!(
        support::wait_until(Duration::from_secs(10), || {
            files = queue_files(&lock);
            files.iter().any(|f| f.ends_with(".lease"))
        }),
        "the head prepared no lease: {files:?}"
    );
    let prepared = files.iter().find(|f| f.ends_with(".lease")).unwrap();
    assert_eq!(files.len(), 2, "a ticket and its prepared lease: {files:?}");
    let prepared_ino = ino(&lock
        .parent()
        .unwrap()
        .join(format!(".prep.lock.leasehold-queue/{prepared}")));
    let t0 = Instant::now();
    holder.release().unwrap();
    let _ = wait_lines(&log, 1, 30);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "woken by a tick? {took:?}"
    );
    assert_eq!(ino(&lock), prepared_ino, "LOCK is not the prepared file");
    assert_eq!(queue_files(&lock), Vec::<String>::new());
    let v = leasehold::status(&lock).unwrap();
    assert_eq!(v.state, leasehold::State::Held, "{v}");
    fs::remove_file(&hold).unwrap();
    w.all_succeed();
}

/// A head that dies (SIGKILL) or gives up (timeout) leaves no ticket and no prepared lease:
/// the dead one's files go with the next look at the queue, the timed-out one removes its own.
#[test]
fn a_head_that_dies_or_times_out_leaves_no_prepared_lease() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("gone.lock"), dir.path().join("log"));
    let holder = held(&lock, Duration::from_secs(60));
    let has_lease = |lock: &Path| queue_files(lock).iter().any(|f| f.ends_with(".lease"));
    // Killed at the head.
    let mut w = queue_up(&lock, &log, 1, 60_000, &[]);
    assert!(
        support::wait_until(Duration::from_secs(10), || has_lease(&lock)),
        "no prepared lease"
    );
    w.children[0].1.kill();
    assert!(has_lease(&lock), "{:?}", queue_files(&lock));
    // A one-shot look at the queue removes the dead waiter's ticket and lease.
    let e = LeaseBuilder::new(&lock)
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .expect_err("held");
    assert!(matches!(e, leasehold::Error::WouldBlock { .. }), "{e}");
    assert_eq!(queue_files(&lock), Vec::<String>::new());
    // Timed out at the head.
    let mut late = spawn("late", &lock, &log, 60_000, &[("LH_WAIT_MS", "700".into())]);
    assert!(
        support::wait_until(Duration::from_secs(10), || has_lease(&lock)),
        "no prepared lease"
    );
    assert_eq!(late.wait_timeout(EXIT).code(), Some(75));
    assert!(
        fs::read_to_string(&log).unwrap().contains("late error 75"),
        "the late waiter did not time out"
    );
    assert_eq!(queue_files(&lock), Vec::<String>::new());
    drop(holder);
}

/// A lease on `lock` taken at once by this process (the holder the waiters queue behind).
fn held(lock: &Path, ttl: Duration) -> leasehold::LeaseGuard {
    LeaseBuilder::new(lock).ttl(ttl).try_acquire().unwrap()
}

/// `--slots 2`, both held by this process; 5 waiters queued. One holder releases (its process
/// lives on, so only the release itself can wake anyone, and well before the head's 5 s tick):
/// the head wakes and takes the freed slot, its successor wakes at most once to become the
/// head and finds no slot; nobody further back wakes. Then everyone is served in arrival order
/// (by token: two slot holders may log out of order).
#[test]
fn a_slot_release_wakes_only_the_head_and_the_line_keeps_its_order() {
    let dir = scratch();
    let (lock, log) = (dir.path().join("slots.lock"), dir.path().join("log"));
    let hold = dir.path().join("hold");
    fs::write(&hold, "").unwrap();
    let slot = || {
        LeaseBuilder::new(&lock)
            .ttl(Duration::from_secs(60))
            .slots(2)
            .try_acquire()
            .unwrap()
    };
    let (first, second) = (slot(), slot());
    let extra = [
        ("LH_HOLD_FILE", hold.display().to_string()),
        ("LH_SLOTS", "2".to_string()),
    ];
    let mut w = queue_up(&lock, &log, 5, 60_000, &extra);
    let before = settled(&w);
    first.release().unwrap();
    // Woken by the release itself, not by its tick (min(TTL/4, 5 s) = 5 s).
    let _ = wait_lines(&log, 1, 2);
    let woke = woken_since(&w, &before, "slot waiters");
    assert!(woke[0], "the head did not wake");
    assert_eq!(&woke[2..], &[false, false, false], "a herd woke: {woke:?}");
    assert_eq!(
        wait_lines(&log, 1, 1).len(),
        1,
        "more than the freed slot was taken"
    );
    second.release().unwrap();
    fs::remove_file(&hold).unwrap();
    // Two may hold together, so they may log out of order: the order they were served in is
    // that of their tokens.
    let mut lines = wait_lines(&log, 5, 30);
    let _ = served(&lines);
    lines.sort_by_key(|l| l.split(' ').nth(1).and_then(|t| t.parse::<u64>().ok()));
    assert_eq!(served(&lines), ["w0", "w1", "w2", "w3", "w4"]);
    for (_, c) in &mut w.children {
        assert!(c.wait_timeout(EXIT).success());
    }
}
