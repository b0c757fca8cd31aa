//! Kills at every step: SIGKILLed holders and waiters, through the library and through
//! `leasehold run`.
//!
//! Each trial starts a holder and, in most trials, a waiter that queues behind it, both on one
//! LOCK in /dev/shm with TTL 200 ms and a 20 ms heartbeat; SIGKILLs the holder, the waiter or
//! both at a random point (during start-up and acquisition, mid-hold and mid-renew, around
//! release); reaps everyone; then checks: LOCK parses (serde_json and the library's status; with
//! the CLI also `leasehold status` exit 0), nothing but documented helpers lies beside LOCK or
//! in its queue directory, the next run gets the lock within TTL + 1 s (a same-host dead holder
//! should be immediate) with a token greater than every token seen, and no two critical
//! sections overlapped (the shared checker, `support::cs`: every kill is declared to it first).
//! The run must count: at least one trial (`LEASEHOLD_TRIALS`, default 1,000), and holders
//! killed inside their critical section in at least one trial in 20.
//!
//! **Starved** (`kill_cli_trials_while_real_time_hogs_starve_every_core`, ignored in a plain run
//! because it starves every other test; `.ci/run` runs it alone): the same `leasehold run`
//! trials while a `SCHED_FIFO` busy loop on every core (bursts of 10–150 ms, pauses of 5–50 ms)
//! starves every ordinary process for longer than the renew window. Holders then miss their
//! deadlines and fence themselves (exit 74, counted), and waiters stop hung holders' jobs: both
//! are leasehold's own kills, so the checker allows dead occupants it was not told of — a live
//! one is still an overlap, and so is any intersection of two jobs' logged intervals.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, Cs, Proc, Rng};

pub const TTL: Duration = Duration::from_millis(200);
pub const BOUND: Duration = Duration::from_millis(1200); // TTL + 1 s

pub use crate::support::Mode;

/// Role `kill-cli-trials`: the `leasehold run` kill trials, in a process of their own (they
/// make it a child subreaper and reap orphans with waitpid(-1), which must not race other
/// tests' children); prints the figures, panics (exit 101) on any failed check.
pub fn cli_trials_role() -> i32 {
    let f = run_trials(Mode::Cli, support::base_trials(), false);
    print("leasehold run", &f);
    0
}

/// Role `kill-cli-trials-starved`: the `leasehold run` kill trials under real-time CPU hogs on
/// every core (see the module comment); `LEASEHOLD_TRIALS` / 4 of them.
pub fn cli_trials_starved_role() -> i32 {
    let _hogs = Hogs::start(Duration::from_secs(900));
    let f = run_trials(Mode::Cli, support::scaled(250), true);
    print("leasehold run, every core starved", &f);
    0
}

/// Role `starve`: a CPU hog (run under `chrt -f 50 taskset -c N`): busy for 10–150 ms, asleep
/// for 5–50 ms, until `LH_STARVE_SECS` pass (so that it ends even if the test dies hard).
pub fn starve_role() -> i32 {
    let secs: u64 = std::env::var("LH_STARVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut rng = Rng::new("starve");
    while Instant::now() < end {
        let busy = Instant::now() + Duration::from_millis(10 + rng.below(141));
        while Instant::now() < busy {
            std::hint::spin_loop();
        }
        std::thread::sleep(Duration::from_millis(5 + rng.below(46)));
    }
    0
}

/// One `SCHED_FIFO` priority-50 hog pinned to each online core; SIGKILLed on drop.
struct Hogs(Vec<Proc>);

impl Hogs {
    fn start(limit: Duration) -> Hogs {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let hogs = (0..cores)
            .map(|core| {
                let me = std::env::current_exe().expect("current_exe");
                let mut c = Command::new("chrt");
                c.args(["-f", "50", "taskset", "-c", &core.to_string()])
                    .arg(me)
                    .args(support::worker::cmd("starve").get_args())
                    .env(support::worker::ROLE, "starve")
                    .env("LH_STARVE_SECS", limit.as_secs().to_string())
                    .stdin(Stdio::null());
                Proc::spawn(&mut c, &format!("hog on core {core}"))
            })
            .collect();
        Hogs(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for h in &mut self.0 {
            h.kill();
        }
    }
}

#[test]
fn kill_library_holders_and_waiters_at_random_points() {
    let f = run_trials(Mode::Library, support::base_trials(), false);
    print("library", &f);
}

#[test]
fn kill_cli_holders_and_waiters_at_random_points() {
    run_trials_process("kill-cli-trials", "leasehold run kill trials");
}

/// Runs the trials of `role` in a process of their own (see [`cli_trials_role`]), prints their
/// figures and fails unless they all passed.
fn run_trials_process(role: &str, name: &str) {
    let mut c = support::worker::cmd(role);
    // Its stderr (the trials' leasehold lines, `broke hung lease …`, which read like failures
    // in a passing run) is collected, and shown only if the trials fail.
    c.stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut w = Proc::spawn_piped(c, name);
    let _ = w.stderr_so_far();
    let figures = w.line("faults: kill trials", Duration::from_secs(1800));
    let st = w.wait_timeout(Duration::from_secs(60));
    println!("faults: kill trials {figures}");
    assert!(
        st.success(),
        "{name} failed: {st}; its stderr:\n{}",
        w.stderr()
    );
}

#[test]
#[ignore = "starves every core for about a minute: run alone (`.ci/run` does), e.g. cargo test --release --test faults -- --ignored --exact kill::kill_cli_trials_while_real_time_hogs_starve_every_core"]
fn kill_cli_trials_while_real_time_hogs_starve_every_core() {
    // Real-time scheduling needs CAP_SYS_NICE (root, as in CI) and chrt/taskset (util-linux).
    if support::need_root()
        || support::skip(
            !support::have("chrt") || !support::have("taskset"),
            "needs chrt and taskset (util-linux)",
        )
    {
        return;
    }
    run_trials_process(
        "kill-cli-trials-starved",
        "leasehold run kill trials, every core starved",
    );
}

pub struct Figures {
    pub trials: usize,
    pub violations: usize,
    pub worst_takeover: Duration,
    pub slow_takeovers: usize,
    /// SIGKILLs that landed on a live holder / waiter (not on one that had already exited).
    pub killed_holders: usize,
    pub killed_waiters: usize,
    /// Holders killed after they said they held the lease.
    pub killed_after_ready: usize,
    /// Critical sections that a SIGKILL ended (entered, never left).
    pub killed_inside: usize,
    /// Runs that fenced their command on a missed renewal (exit 74; accepted only when starved).
    pub fenced: usize,
}

fn spawn(mode: Mode, lock: &Path, work: &Path, trial: usize, name: &str, hold_ms: u64) -> Proc {
    let ready = work.join(format!("{name}.ready"));
    let _ = fs::remove_file(&ready);
    let wait = Duration::from_secs(3);
    let id = format!("t{trial}-{name}");
    let mut c = support::contender(mode, &id, lock, TTL, wait, hold_ms, &work.join("cs"));
    c.env("FAULTS_READY", &ready);
    Proc::spawn(&mut c, name)
}

/// SIGKILLs `p` after declaring it killed to the checker; whether the kill landed (it had not
/// exited by itself before).
fn kill(cs: &Cs, p: &mut Proc, id: &str) -> bool {
    cs.declare_killed(id);
    let landed = p.try_wait().is_none();
    let st = p.kill();
    landed && std::os::unix::process::ExitStatusExt::signal(&st) == Some(9)
}

fn max_token(lock: &Path, seen: &mut u64) {
    if let Ok(b) = fs::read(lock)
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b)
        && let Some(t) = v["token"].as_u64()
    {
        *seen = (*seen).max(t);
    }
}

/// Reaps orphans reparented to us (we are a child subreaper in CLI mode) once our own children
/// are all waited for: PID 1 on these machines does not reap them.
fn reap_orphans() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(st) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if st == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Runs `trials` kill trials through `mode`; `starved`: every core is starved (by [`Hogs`]), so
/// a run that fences its command on a missed renewal (exit 74) is counted, not a problem.
pub fn run_trials(mode: Mode, trials: usize, starved: bool) -> Figures {
    let mut rng = Rng::new(&format!("kill trials ({mode:?})"));
    let base = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").expect("tempdir")
    } else {
        tempfile::tempdir().expect("tempdir")
    };
    let lockdir = base.path().join("locks");
    let work = base.path().join("work");
    fs::create_dir_all(&lockdir).unwrap();
    fs::create_dir_all(&work).unwrap();
    let cs = Cs::new(&work, "cs");
    // A holder starved past its renew deadline is fenced by its own wrapper, or stopped by the
    // waiter as hung: leasehold's own kills, undeclared, of a process that is dead by the time
    // the next one enters. A live occupant is still a violation.
    cs.allow_fenced();
    assert!(
        trials >= 1,
        "LEASEHOLD_TRIALS={trials}: no trial, nothing proved"
    );
    let lock: PathBuf = lockdir.join("job.lock");
    if mode == Mode::Cli {
        nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
    }
    let mut f = Figures {
        trials,
        violations: 0,
        worst_takeover: Duration::ZERO,
        slow_takeovers: 0,
        killed_holders: 0,
        killed_waiters: 0,
        killed_after_ready: 0,
        killed_inside: 0,
        fenced: 0,
    };
    let mut top_token = 0u64;
    let mut problems: Vec<String> = Vec::new();
    for trial in 0..trials {
        // Starved, some holds outlast the TTL, so that a holder starved past its deadline is
        // still inside when its lease turns stale: its fencing (or the waiter's stop of a hung
        // holder) is what keeps the two apart.
        let hold = if starved {
            rng.below(600)
        } else {
            rng.below(30)
        };
        let mut holder = spawn(mode, &lock, &work, trial, "holder", hold);
        let with_waiter = rng.chance(70);
        let mut waiter =
            with_waiter.then(|| spawn(mode, &lock, &work, trial, "waiter", rng.below(15)));
        // Kill the holder (50 %), the waiter (25 %) or both (25 %), at a random point: either a
        // random delay after start (start-up, mid-acquire, early hold), or a random delay after
        // the holder said it holds (mid-hold, mid-renew, around release).
        // Starved, a third of the trials kill nobody: starvation is then the only fault.
        let pick = rng.below(if starved { 6 } else { 4 });
        let (kill_h, kill_w) = match pick {
            0 | 1 => (true, false),
            2 => (false, true),
            3 => (true, true),
            _ => (false, false),
        };
        let after_ready = rng.chance(50);
        let ready = work.join("holder.ready");
        if after_ready {
            support::wait_until(Duration::from_secs(3), || {
                ready.exists() || holder.try_wait().is_some()
            });
            std::thread::sleep(Duration::from_micros(rng.below((hold + 5) * 1000)));
        } else {
            std::thread::sleep(Duration::from_micros(rng.below(25_000)));
        }
        let mut holder_killed = false;
        if kill_h {
            let was_ready = ready.exists();
            if kill(&cs, &mut holder, &format!("t{trial}-holder")) {
                holder_killed = true;
                f.killed_holders += 1;
                f.killed_after_ready += usize::from(was_ready);
            }
        }
        let mut waiter_killed = false;
        if kill_w && let Some(w) = waiter.as_mut() {
            waiter_killed = kill(&cs, w, &format!("t{trial}-waiter"));
            f.killed_waiters += usize::from(waiter_killed);
        }
        // Survivors finish by themselves (a waiter takes over a dead holder, holds, releases).
        let mut kids: Vec<(&mut Proc, bool)> = vec![(&mut holder, holder_killed)];
        if let Some(w) = waiter.as_mut() {
            kids.push((w, waiter_killed));
        }
        for (k, killed) in kids {
            let st = k.wait_timeout(Duration::from_secs(10));
            let c = support::code(st);
            // 0 = done, 137 = our SIGKILL (only of a process we killed; starved, also the
            // waiter's stop of a holder starved past its TTL), 75 = could not get it in time
            // (should not happen), 74 = fenced on a missed renewal (only a starved host
            // excuses it).
            let sigkill_expected = killed || starved;
            if starved && c == 74 {
                f.fenced += 1;
            } else if c != 0 && !(c == 137 && sigkill_expected) {
                let err = k.stderr();
                problems.push(format!(
                    "trial {trial}: {} exited {c}: {}",
                    k.name,
                    err.trim()
                ));
            }
        }
        if mode == Mode::Cli {
            reap_orphans();
        }
        // The checks.
        max_token(&lock, &mut top_token);
        support::assert_lock_parses(&lock);
        if mode == Mode::Cli {
            let out = Command::new(support::bin())
                .args(["status", "--json"])
                .arg(&lock)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "trial {trial}: leasehold status exited {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .expect("status --json prints JSON");
        }
        let stray = support::stray_files(&lockdir, "job.lock");
        assert!(
            stray.is_empty(),
            "trial {trial}: stray files beside LOCK: {stray:?}"
        );
        let t0 = Instant::now();
        let taken = leasehold::LeaseBuilder::new(&lock)
            .ttl(TTL)
            .durable(false)
            .acquire_timeout(BOUND);
        let took = t0.elapsed();
        let g = match taken {
            Ok(g) => g,
            Err(e) => {
                panic!("trial {trial}: the next run did not get the lock within {BOUND:?}: {e}")
            }
        };
        f.worst_takeover = f.worst_takeover.max(took);
        if took > Duration::from_millis(100) {
            f.slow_takeovers += 1;
        }
        assert!(
            g.token() > top_token,
            "trial {trial}: token {} not above {top_token}",
            g.token()
        );
        top_token = g.token();
        g.release().expect("release");
        let v = cs.violations();
        if v.len() != f.violations {
            problems.push(format!("trial {trial}: overlap: {}", v.join("; ")));
            f.violations = v.len();
        }
    }
    let sections = cs.verify();
    f.killed_inside = sections.iter().filter(|s| !s.ended).count();
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    let need = trials.div_ceil(20);
    assert!(
        f.killed_inside >= need,
        "only {} of {trials} trials killed a holder inside its critical section (need {need}): \
         the kills did not test what they claim",
        f.killed_inside
    );
    f
}

pub fn print(label: &str, f: &Figures) {
    println!(
        "faults: kill trials ({label}): trials={} violations={} worst_takeover_ms={} takeovers_over_100ms={} killed_holders={} killed_waiters={} killed_after_ready={} killed_inside_critical_section={} fenced={} ttl_ms={} bound_ms={}",
        f.trials,
        f.violations,
        f.worst_takeover.as_millis(),
        f.slow_takeovers,
        f.killed_holders,
        f.killed_waiters,
        f.killed_after_ready,
        f.killed_inside,
        f.fenced,
        TTL.as_millis(),
        BOUND.as_millis()
    );
}
