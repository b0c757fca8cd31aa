//! Multi-process contention benchmark: leasehold against raw kernel flock (the floor) and Python
//! filelock's `FileLock` and `SoftFileLease`, in the same run, on tmpfs and on the project's disk.
//!
//! `cargo bench --bench contention` runs it; `bash benches/compare/run.sh` runs it with the
//! Python venv and turns its JSON into docs/benchmarks.md and docs/bench.svg.
//!
//! Every worker is a real process: this binary re-executed as `contention worker ...`, or
//! `python benches/compare/filelock_worker.py ...` for the Python locks. All timestamps are
//! CLOCK_MONOTONIC nanoseconds, comparable across processes; each worker reports its own stamps
//! on stdout.
//!
//! Phases, for N = 1, 2, 4, 8, 16, 32, 64 workers (the growth curves of issue 17):
//! - throughput: an empty critical section, no think time, for a fixed wall time; acquisitions
//!   per second, fairness (max/min acquisitions per worker) and the worst wait;
//! - handoff: a 1–3 ms critical section (sleep) and 0.5 ms think time; the handoff latency is
//!   release (stamp just before the release call) → the next holder inside its critical section,
//!   counted when that next holder is another worker that was already waiting. For N = 1 the
//!   figure is the uncontended acquisition latency.
//!
//! And takeover: a holder process takes the lock and sleeps; a second process waits for it; the
//! holder is SIGKILLed 3–13 ms later; the latency is kill → the waiter inside its critical section,
//! reported beside kill → the holder reaped (the kernel's teardown of the holder, the part of a
//! takeover no lock implementation can shorten).
//!
//! Environment: `LEASEHOLD_BENCH_QUICK=1` (short run), `LEASEHOLD_BENCH_OUT` (JSON path, default
//! target/bench/contention.json), `LEASEHOLD_BENCH_PYTHON` (a python with filelock; Python rows are
//! skipped without it), `LEASEHOLD_BENCH_DISK` (disk scratch dir, default target/bench-scratch),
//! `LEASEHOLD_BENCH_IMPLS` (comma list to restrict: flock,leasehold,filelock,softfilelease; or
//! the shared-lock rows, run only when named: `flock-s` — kernel `flock -s`, LOCK_SH — and
//! `leasehold-shared` — `LeaseBuilder::shared`; their "handoff" column is not a hand-over),
//! `LEASEHOLD_BENCH_NS` (comma list of N), `LEASEHOLD_BENCH_ROUNDS` (rounds of the paired
//! hand-over phase, default 5, 2 when quick; 0 skips it).
//!
//! Paired hand-over phase: a ratio is only as good as its baseline, and the kernel flock
//! hand-over moves with the machine's state (12–37 µs here from run to run). So on tmpfs, for
//! each N from 2 to 16 (the N of the hand-over targets; N = 32 and 64 are growth curves, one
//! cell each), leasehold and flock hand-over cells alternate for several rounds (A B A B …), and
//! each round gives one ratio of the two p50s measured back to back; the report gives the median
//! ratio over the rounds with its min–max, beside both absolute p50s.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

type Res<T> = Result<T, String>;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn mono_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

fn sleep_until_ns(t: u64) {
    let now = mono_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Implementations under test

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    Flock,
    Leasehold,
    FileLock,
    SoftFileLease,
    /// Shared-lock rows (only when named in `LEASEHOLD_BENCH_IMPLS`).
    FlockShared,
    LeaseholdShared,
}

impl Impl {
    const ALL: [Impl; 4] = [
        Impl::Flock,
        Impl::Leasehold,
        Impl::FileLock,
        Impl::SoftFileLease,
    ];
    const SHARED: [Impl; 2] = [Impl::FlockShared, Impl::LeaseholdShared];
    fn key(self) -> &'static str {
        match self {
            Impl::Flock => "flock",
            Impl::Leasehold => "leasehold",
            Impl::FileLock => "filelock",
            Impl::SoftFileLease => "softfilelease",
            Impl::FlockShared => "flock-s",
            Impl::LeaseholdShared => "leasehold-shared",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Impl::Flock => "kernel flock (floor)",
            Impl::Leasehold => "leasehold",
            Impl::FileLock => "filelock.FileLock",
            Impl::SoftFileLease => "filelock.SoftFileLease",
            Impl::FlockShared => "kernel flock -s (floor, shared)",
            Impl::LeaseholdShared => "leasehold --shared",
        }
    }
    fn parse(s: &str) -> Option<Impl> {
        Impl::ALL
            .into_iter()
            .chain(Impl::SHARED)
            .find(|i| i.key() == s)
    }
    fn is_python(self) -> bool {
        matches!(self, Impl::FileLock | Impl::SoftFileLease)
    }
}

/// One lock held by a worker, of whichever implementation.
enum Locker {
    Flock(File),
    FlockShared(File),
    Leasehold(Box<leasehold::LeaseBuilder>),
}

enum Held {
    Flock,
    Lease(Box<leasehold::LeaseGuard>),
}

impl Locker {
    fn new(kind: Impl, path: &Path) -> Res<Locker> {
        let open = || {
            File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| format!("open {}: {e}", path.display()))
        };
        let lease = || leasehold::LeaseBuilder::new(path).ttl(Duration::from_secs(30));
        match kind {
            Impl::Flock => open().map(Locker::Flock),
            Impl::FlockShared => open().map(Locker::FlockShared),
            Impl::Leasehold => Ok(Locker::Leasehold(Box::new(lease()))),
            Impl::LeaseholdShared => Ok(Locker::Leasehold(Box::new(lease().shared(true)))),
            _ => Err(format!("{} is run by the Python worker", kind.key())),
        }
    }

    /// Waits for the lock, at most until `deadline_ns` (0 = for ever). `Ok(None)` on timeout.
    fn acquire(&mut self, deadline_ns: u64) -> Res<Option<Held>> {
        match self {
            Locker::Flock(f) => f
                .lock()
                .map(|()| Some(Held::Flock))
                .map_err(|e| format!("flock: {e}")),
            Locker::FlockShared(f) => f
                .lock_shared()
                .map(|()| Some(Held::Flock))
                .map_err(|e| format!("flock -s: {e}")),
            Locker::Leasehold(b) => {
                let r = if deadline_ns == 0 {
                    b.acquire()
                } else {
                    let now = mono_ns();
                    if now >= deadline_ns {
                        return Ok(None);
                    }
                    b.acquire_timeout(Duration::from_nanos(deadline_ns - now))
                };
                match r {
                    Ok(g) => Ok(Some(Held::Lease(Box::new(g)))),
                    Err(leasehold::Error::Timeout { .. }) => Ok(None),
                    Err(e) => Err(format!("leasehold acquire: {e}")),
                }
            }
        }
    }

    fn release(&mut self, h: Held) -> Res<()> {
        match (self, h) {
            (Locker::Flock(f) | Locker::FlockShared(f), Held::Flock) => {
                f.unlock().map_err(|e| format!("unlock: {e}"))
            }
            (_, Held::Lease(g)) => g.release().map_err(|e| format!("leasehold release: {e}")),
            _ => Err("mismatched lock".into()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Worker side

/// `worker IMPL PHASE LOCK HOLD_MIN_US HOLD_MAX_US THINK_US RECORD`
fn worker(args: &[String]) -> Res<()> {
    let [kind, phase, lock, hold_min, hold_max, think, record] = args else {
        return Err(format!("worker: bad arguments {args:?}"));
    };
    let kind = Impl::parse(kind).ok_or_else(|| format!("unknown impl {kind}"))?;
    let num = |s: &String| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
    let (hold_min, hold_max, think) = (num(hold_min)?, num(hold_max)?, num(think)?);
    let record = record == "1";
    let path = PathBuf::from(lock);
    let mut locker = Locker::new(kind, &path)?;
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock, s: &str| -> Res<()> {
        writeln!(out, "{s}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))
    };
    match phase.as_str() {
        "hold" => {
            let held = locker.acquire(0)?;
            say(&mut out, "held")?;
            std::thread::sleep(Duration::from_secs(3600));
            drop(held);
            Ok(())
        }
        "take" => {
            say(&mut out, "waiting")?;
            let Some(h) = locker.acquire(mono_ns() + 20_000_000_000)? else {
                return Err("takeover timed out after 20 s".into());
            };
            let t1 = mono_ns();
            say(&mut out, &format!("got {t1}"))?;
            locker.release(h)
        }
        "loop" => {
            say(&mut out, "ready")?;
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("stdin: {e}"))?;
            let mut it = line.split_whitespace();
            let (Some("go"), Some(start), Some(end)) = (it.next(), it.next(), it.next()) else {
                return Err(format!("worker: expected 'go START END', got {line:?}"));
            };
            let (start, end) = (num(&start.into())?, num(&end.into())?);
            let mut rng = Rng::new(u64::from(std::process::id()) ^ start);
            sleep_until_ns(start);
            let (mut count, mut worst, mut errors) = (0u64, 0u64, 0u64);
            let mut first_error = String::new();
            let mut recs: Vec<(u64, u64, u64)> = Vec::new();
            // An error from acquire or release is counted and reported, and the loop goes on:
            // the table shows how often a user would have seen one.
            let mut failed = |e: String| {
                errors += 1;
                if first_error.is_empty() {
                    first_error = e.replace('\n', " ");
                }
                std::thread::sleep(Duration::from_micros(100));
            };
            loop {
                let ws = mono_ns();
                if ws >= end {
                    break;
                }
                let h = match locker.acquire(end) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        failed(e);
                        continue;
                    }
                };
                let t1 = mono_ns();
                if hold_max > 0 {
                    std::thread::sleep(Duration::from_micros(rng.between(hold_min, hold_max)));
                }
                let t0 = mono_ns();
                if let Err(e) = locker.release(h) {
                    failed(e);
                }
                if t1 <= end {
                    count += 1;
                    worst = worst.max(t1 - ws);
                    if record && recs.len() < 200_000 {
                        recs.push((ws, t1, t0));
                    }
                }
                if think > 0 {
                    std::thread::sleep(Duration::from_micros(think));
                }
            }
            say(&mut out, &format!("count {count}"))?;
            say(&mut out, &format!("worst {worst}"))?;
            say(&mut out, &format!("errors {errors} {first_error}"))?;
            for (ws, t1, t0) in recs {
                writeln!(out, "rec {ws} {t1} {t0}").map_err(|e| format!("stdout: {e}"))?;
            }
            say(&mut out, "done")
        }
        p => Err(format!("unknown phase {p}")),
    }
}

// ---------------------------------------------------------------------------------------------
// Orchestrator side

struct Setup {
    quick: bool,
    python: Option<PathBuf>,
    py_worker: PathBuf,
    impls: Vec<Impl>,
    ns: Vec<usize>,
    self_exe: PathBuf,
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    fn spawn(
        s: &Setup,
        kind: Impl,
        phase: &str,
        lock: &Path,
        params: [u64; 3],
        record: bool,
    ) -> Res<Proc> {
        let mut cmd = if kind.is_python() {
            let py = s
                .python
                .as_ref()
                .ok_or("no python configured (LEASEHOLD_BENCH_PYTHON)")?;
            let mut c = Command::new(py);
            c.arg(&s.py_worker);
            c
        } else {
            let mut c = Command::new(&s.self_exe);
            c.arg("worker");
            c
        };
        cmd.arg(kind.key())
            .arg(phase)
            .arg(lock)
            .args(params.iter().map(u64::to_string))
            .arg(if record { "1" } else { "0" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {} worker: {e}", kind.key()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            child,
            stdin,
            lines: rx,
        })
    }

    fn expect(&self, prefix: &str, timeout: Duration) -> Res<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) if l.starts_with(prefix) => Ok(l),
            Ok(l) => Err(format!("worker said {l:?}, expected {prefix:?}")),
            Err(RecvTimeoutError::Timeout) => {
                Err(format!("no {prefix:?} from worker in {timeout:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => Err(format!("worker exited before {prefix:?}")),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

/// One timed loop phase with `n` workers; returns its JSON result.
fn run_loop(
    s: &Setup,
    kind: Impl,
    lock: &Path,
    n: usize,
    secs: f64,
    params: [u64; 3],
    record: bool,
) -> Res<Value> {
    let mut procs = Vec::with_capacity(n);
    for _ in 0..n {
        procs.push(Proc::spawn(s, kind, "loop", lock, params, record)?);
    }
    for p in &procs {
        p.expect("ready", Duration::from_secs(60))?;
    }
    let start = mono_ns() + 30_000_000;
    let end = start + (secs * 1e9) as u64;
    for p in &mut procs {
        let mut stdin = p.stdin.take().ok_or("no stdin")?;
        writeln!(stdin, "go {start} {end}").map_err(|e| format!("write go: {e}"))?;
    }
    let grace = Duration::from_secs_f64(secs + 60.0);
    let mut counts = Vec::with_capacity(n);
    let mut worst = 0u64;
    let (mut errors, mut first_error) = (0u64, String::new());
    let mut recs: Vec<(usize, u64, u64, u64)> = Vec::new();
    for (w, p) in procs.iter_mut().enumerate() {
        let deadline = Instant::now() + grace;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match p.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(_) => return Err(format!("worker {w} did not finish")),
            };
            let mut f = line.split_whitespace();
            let tag = f.next().unwrap_or("");
            let mut v = || -> Res<u64> {
                f.next()
                    .and_then(|x| x.parse().ok())
                    .ok_or_else(|| format!("bad worker line {line:?}"))
            };
            match tag {
                "count" => counts.push(v()?),
                "worst" => worst = worst.max(v()?),
                "errors" => {
                    errors += v()?;
                    let msg: Vec<&str> = f.collect();
                    if first_error.is_empty() && !msg.is_empty() {
                        first_error = msg.join(" ");
                    }
                }
                "rec" => recs.push((w, v()?, v()?, v()?)),
                "done" => break,
                _ => return Err(format!("bad worker line {line:?}")),
            }
        }
        let _ = p.child.wait();
    }
    let total: u64 = counts.iter().sum();
    let (mx, mn) = (
        counts.iter().copied().max().unwrap_or(0),
        counts.iter().copied().min().unwrap_or(0),
    );
    let mut r = json!({
        "n": n,
        "secs": secs,
        "acquisitions": total,
        "throughput_per_s": total as f64 / secs,
        "per_worker": counts,
        "fairness_max_over_min": if mn == 0 { Value::Null } else { json!(mx as f64 / mn as f64) },
        "starved_workers": counts.iter().filter(|&&c| c == 0).count(),
        "worst_wait_us": worst as f64 / 1e3,
        "errors": errors,
        "first_error": first_error,
    });
    if record {
        recs.sort_by_key(|r| r.2);
        let mut lat: Vec<u64> = if n == 1 {
            recs.iter().map(|r| r.2 - r.1).collect()
        } else {
            recs.windows(2)
                .filter(|p| p[1].0 != p[0].0 && p[1].1 < p[0].3 && p[1].2 >= p[0].3)
                .map(|p| p[1].2 - p[0].3)
                .collect()
        };
        lat.sort_unstable();
        r["handoffs"] = json!(lat.len());
        r["handoff_p50_us"] = json!(pct(&lat, 50.0) as f64 / 1e3);
        r["handoff_p99_us"] = json!(pct(&lat, 99.0) as f64 / 1e3);
        r["handoff_kind"] = json!(if n == 1 {
            "uncontended acquire"
        } else {
            "handoff"
        });
    }
    Ok(r)
}

fn run_takeover(s: &Setup, kind: Impl, dir: &Path, trials: usize) -> Res<Value> {
    let mut rng = Rng::new(mono_ns());
    let mut lat = Vec::with_capacity(trials);
    let mut gone = Vec::with_capacity(trials);
    for t in 0..trials {
        let lock = dir.join(format!("{}-takeover-{t}.lock", kind.key()));
        let mut holder = Proc::spawn(s, kind, "hold", &lock, [0; 3], false)?;
        holder.expect("held", Duration::from_secs(30))?;
        let taker = Proc::spawn(s, kind, "take", &lock, [0; 3], false)?;
        taker.expect("waiting", Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_micros(rng.between(3_000, 13_000)));
        let t0 = mono_ns();
        // `kill` also reaps: it returns once the kernel has torn the holder down (its threads
        // gone, its files closed), which is as early as any judgement could see it dead.
        holder.kill();
        gone.push(mono_ns().saturating_sub(t0));
        let got = taker.expect("got", Duration::from_secs(30))?;
        let t1: u64 = got
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| format!("bad line {got:?}"))?;
        lat.push(t1.saturating_sub(t0));
        drop(taker);
    }
    lat.sort_unstable();
    gone.sort_unstable();
    Ok(json!({
        "trials": trials,
        "gone_p50_us": pct(&gone, 50.0) as f64 / 1e3,
        "p50_us": pct(&lat, 50.0) as f64 / 1e3,
        "p90_us": pct(&lat, 90.0) as f64 / 1e3,
        "max_us": lat.last().copied().unwrap_or(0) as f64 / 1e3,
    }))
}

fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| v.split(',').map(|x| x.trim().to_string()).collect())
}

fn fmt_us(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x >= 10_000.0 => format!("{:.1} ms", x / 1e3),
        Some(x) if x >= 1_000.0 => format!("{:.2} ms", x / 1e3),
        Some(x) => format!("{x:.1} µs"),
        None => "—".into(),
    }
}

fn orchestrate() -> Res<()> {
    let quick = std::env::var("LEASEHOLD_BENCH_QUICK").is_ok_and(|v| v == "1");
    let mut impls: Vec<Impl> = match env_list("LEASEHOLD_BENCH_IMPLS") {
        Some(l) => l
            .iter()
            .map(|k| Impl::parse(k).ok_or_else(|| format!("unknown impl {k}")))
            .collect::<Res<_>>()?,
        None => Impl::ALL.to_vec(),
    };
    let python = std::env::var_os("LEASEHOLD_BENCH_PYTHON").map(PathBuf::from);
    if python.is_none() && impls.iter().any(|i| i.is_python()) {
        eprintln!("contention: LEASEHOLD_BENCH_PYTHON not set; skipping the Python filelock rows");
        impls.retain(|i| !i.is_python());
    }
    let ns: Vec<usize> = match env_list("LEASEHOLD_BENCH_NS") {
        Some(l) => l
            .iter()
            .map(|x| x.parse().map_err(|e| format!("N {x}: {e}")))
            .collect::<Res<_>>()?,
        None => vec![1, 2, 4, 8, 16, 32, 64],
    };
    let s = Setup {
        quick,
        python,
        py_worker: Path::new(MANIFEST_DIR).join("benches/compare/filelock_worker.py"),
        impls,
        ns,
        self_exe: std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?,
    };
    let (tp_secs, ho_secs, trials) = if s.quick {
        (0.3, 0.5, 6)
    } else {
        (2.0, 2.5, 30)
    };
    let disk = std::env::var_os("LEASEHOLD_BENCH_DISK")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(MANIFEST_DIR).join("target/bench-scratch"));
    let run_id = format!("contention-{}", std::process::id());
    let mut fss = Vec::new();
    if Path::new("/dev/shm").is_dir() {
        fss.push(("tmpfs", PathBuf::from("/dev/shm").join(&run_id)));
    } else {
        eprintln!("contention: no /dev/shm; skipping tmpfs");
    }
    fss.push(("disk", disk.join(&run_id)));

    let mut results = BTreeMap::new();
    for (fs, dir) in &fss {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let mut per_impl = BTreeMap::new();
        for &kind in &s.impls {
            let mut rows = Vec::new();
            for &n in &s.ns {
                let t = Instant::now();
                let lock = dir.join(format!("{}-tp-{n}.lock", kind.key()));
                let tp = run_loop(&s, kind, &lock, n, tp_secs, [0, 0, 0], false);
                let lock = dir.join(format!("{}-ho-{n}.lock", kind.key()));
                let ho = run_loop(&s, kind, &lock, n, ho_secs, [1000, 3000, 500], true);
                let row = match (tp, ho) {
                    (Ok(tp), Ok(ho)) => json!({ "n": n, "throughput": tp, "handoff": ho }),
                    (tp, ho) => {
                        let err = [tp.err(), ho.err()]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join("; ");
                        eprintln!("contention: {fs} {} N={n}: {err}", kind.key());
                        json!({ "n": n, "error": err })
                    }
                };
                eprintln!(
                    "contention: {fs:5} {:14} N={n:2}: {:>10} acq/s, handoff p50 {} ({:.1}s)",
                    kind.key(),
                    row["throughput"]["throughput_per_s"]
                        .as_f64()
                        .map_or("—".into(), |x| format!("{x:.0}")),
                    fmt_us(&row["handoff"]["handoff_p50_us"]),
                    t.elapsed().as_secs_f64()
                );
                rows.push(row);
            }
            // Two shared holders do not wait for each other: nothing to take over.
            let takeover = if Impl::SHARED.contains(&kind) {
                json!({ "skipped": "shared lock" })
            } else {
                match run_takeover(&s, kind, dir, trials) {
                    Ok(v) => v,
                    Err(e) => {
                        eprintln!("contention: {fs} {} takeover: {e}", kind.key());
                        json!({ "error": e })
                    }
                }
            };
            eprintln!(
                "contention: {fs:5} {:14} takeover p50 {}",
                kind.key(),
                fmt_us(&takeover["p50_us"])
            );
            per_impl.insert(
                kind.key(),
                json!({ "label": kind.label(), "rows": rows, "takeover": takeover }),
            );
        }
        let _ = std::fs::remove_dir_all(dir);
        results.insert(*fs, per_impl);
    }

    let rounds = std::env::var("LEASEHOLD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if s.quick { 2 } else { 5 });
    let paired = paired_handoffs(&s, rounds, ho_secs)?;

    let doc = json!({
        "quick": s.quick,
        "paired": paired,
        "params": {
            "throughput_secs": tp_secs,
            "handoff_secs": ho_secs,
            "handoff_hold_us": [1000, 3000],
            "handoff_think_us": 500,
            "takeover_trials": trials,
            "leasehold_ttl_s": 30,
            "paired_rounds": rounds,
        },
        "results": results,
    });
    let out = std::env::var_os("LEASEHOLD_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(MANIFEST_DIR).join("target/bench/contention.json"));
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&out, text).map_err(|e| format!("write {}: {e}", out.display()))?;

    // A markdown summary on stdout.
    println!("| fs | impl | N | acq/s | max/min | worst wait | handoff p50 | p99 |");
    println!("|---|---|---|---|---|---|---|---|");
    for (fs, per_impl) in &results {
        for (k, v) in per_impl {
            for row in v["rows"].as_array().into_iter().flatten() {
                let tp = &row["throughput"];
                let ho = &row["handoff"];
                println!(
                    "| {fs} | {k} | {} | {} | {} | {} | {} | {} |",
                    row["n"],
                    tp["throughput_per_s"]
                        .as_f64()
                        .map_or("—".into(), |x| format!("{x:.0}")),
                    tp["fairness_max_over_min"]
                        .as_f64()
                        .map_or("∞".into(), |x| format!("{x:.2}")),
                    fmt_us(&tp["worst_wait_us"]),
                    fmt_us(&ho["handoff_p50_us"]),
                    fmt_us(&ho["handoff_p99_us"]),
                );
            }
        }
    }
    eprintln!("contention: wrote {}", out.display());
    Ok(())
}

/// The paired hand-over phase (see the module comment): on tmpfs, for each N in 2..=16 asked for,
/// `rounds` rounds of a leasehold cell then a flock cell. Returns
/// `{"fs": "tmpfs", "rows": [{"n": N, "rounds": [{"leasehold": p50, "flock": p50}, ...]}]}`
/// (µs); a cell that failed is null.
/// The largest N of the paired phase: the hand-over targets stop at N = 16.
const PAIRED_MAX_N: usize = 16;

fn paired_handoffs(s: &Setup, rounds: usize, secs: f64) -> Res<Value> {
    let pair = [Impl::Leasehold, Impl::Flock];
    let both = pair
        .iter()
        .all(|k| s.impls.iter().any(|i| i.key() == k.key()));
    if rounds == 0 || !both || !Path::new("/dev/shm").is_dir() {
        return Ok(Value::Null);
    }
    let dir = PathBuf::from("/dev/shm").join(format!("contention-paired-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    let mut rows = Vec::new();
    for &n in s.ns.iter().filter(|&&n| (2..=PAIRED_MAX_N).contains(&n)) {
        let mut per_round = Vec::new();
        for r in 0..rounds {
            let mut cell = serde_json::Map::new();
            for kind in pair {
                let lock = dir.join(format!("{}-paired-{n}-{r}.lock", kind.key()));
                let p50 = run_loop(s, kind, &lock, n, secs, [1000, 3000, 500], true)
                    .map(|v| v["handoff_p50_us"].clone())
                    .unwrap_or_else(|e| {
                        eprintln!("contention: paired {} N={n} round {r}: {e}", kind.key());
                        Value::Null
                    });
                cell.insert(kind.key().into(), p50);
            }
            eprintln!(
                "contention: paired N={n:2} round {r}: leasehold {} flock {}",
                fmt_us(&cell["leasehold"]),
                fmt_us(&cell["flock"])
            );
            per_round.push(Value::Object(cell));
        }
        rows.push(json!({ "n": n, "rounds": per_round }));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({ "fs": "tmpfs", "secs": secs, "rows": rows }))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let r = if args.get(1).map(String::as_str) == Some("worker") {
        worker(&args[2..])
    } else {
        orchestrate()
    };
    if let Err(e) = r {
        eprintln!("contention: {e}");
        std::process::exit(1);
    }
}
