//! In-process costs of single lease operations, each beside its raw floor measured in the same run,
//! on tmpfs (/dev/shm) and on the project's disk (target/bench-scratch).
//!
//! - `leasehold_acquire_release`: `LeaseBuilder::try_acquire` + `LeaseGuard::release`, uncontended,
//!   default (durable) settings. Floor `floor_acquire_release`: what the protocol must at least do
//!   — open+flock the mutex, read LOCK, an atomic durable write (temp, fsync, rename, fsync dir),
//!   close; then open+flock again, a second atomic durable write (the released record), close.
//! - `leasehold_acquire_blocking_release`: the same through the blocking `acquire()`, which is
//!   what `leasehold run` and every contender call (it prepares a waiter even when the lock is free).
//! - `leasehold_renewal`: one heartbeat, measured as the period of a guard whose heartbeat
//!   interval is 1 ns (it renews back to back; there is no public renew-now hook). Floor
//!   `floor_renew_in_place`: open LOCK read-write, read it, pwrite the header, close.
//! - `leasehold_status`: `leasehold::status` of a held lease. Floor `floor_status`: open+flock+close
//!   of the mutex and open+read+close of LOCK.
//! - Primitive floors: `floor_open_flock_close` (floor doc 1b), `floor_atomic_write_fsync` (2a),
//!   `floor_read_lease` (2c).
//!
//! `LEASEHOLD_BENCH_QUICK=1` shortens every measurement.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn quick() -> bool {
    std::env::var("LEASEHOLD_BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn config() -> Criterion {
    let c = Criterion::default().without_plots();
    if quick() {
        c.warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(700))
            .sample_size(10)
    } else {
        c.warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4))
            .sample_size(40)
    }
}

/// Ends the benchmark with a message instead of a panic.
fn or_die<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ops bench: {what}: {e}");
            std::process::exit(1);
        }
    }
}

fn open_flock_close(p: &Path) {
    let f = or_die(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p),
        "open",
    );
    or_die(f.lock(), "flock");
    drop(f);
}

fn read_file(p: &Path, buf: &mut [u8]) -> usize {
    let mut f = or_die(File::open(p), "open lease");
    or_die(f.read(buf), "read lease")
}

/// The floor doc's 2a: temp file (O_CREAT|O_EXCL), write, fsync, close, rename over, fsync dir.
fn atomic_write(dir: &Path, tmp: &Path, target: &Path, bytes: &[u8]) {
    let mut f = or_die(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(tmp),
        "create temp",
    );
    or_die(f.write_all(bytes), "write temp");
    or_die(f.sync_data(), "fsync temp");
    drop(f);
    or_die(std::fs::rename(tmp, target), "rename");
    let d = or_die(File::open(dir), "open dir");
    or_die(d.sync_all(), "fsync dir");
}

fn bench_fs(c: &mut Criterion, label: &str, dir: &Path) {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("ops bench: skipping {label}: mkdir {}: {e}", dir.display());
        return;
    }
    let lock = dir.join("ops.lock");
    let floor_lock = dir.join("floor.lock");
    let floor_mutex = dir.join(".floor.lock.mutex");
    let floor_tmp = dir.join(".floor.lock.tmp");
    // A real lease record, for realistic sizes in the floors.
    let g = or_die(leasehold::LeaseBuilder::new(&lock).try_acquire(), "acquire");
    let record = or_die(std::fs::read(&lock), "read lease");
    or_die(g.release(), "release");
    or_die(std::fs::write(&floor_lock, &record), "write floor lease");
    let mut buf = vec![0u8; 4096];

    let mut grp = c.benchmark_group(format!("ops_{label}"));

    grp.bench_function("floor_open_flock_close", |b| {
        b.iter(|| open_flock_close(&floor_mutex))
    });
    grp.bench_function("floor_read_lease", |b| {
        b.iter(|| black_box(read_file(&floor_lock, &mut buf)))
    });
    grp.bench_function("floor_atomic_write_fsync", |b| {
        b.iter(|| atomic_write(dir, &floor_tmp, &floor_lock, &record))
    });
    grp.bench_function("floor_acquire_release", |b| {
        b.iter(|| {
            let m = or_die(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&floor_mutex),
                "open mutex",
            );
            or_die(m.lock(), "flock");
            black_box(read_file(&floor_lock, &mut buf));
            atomic_write(dir, &floor_tmp, &floor_lock, &record);
            drop(m);
            let m = or_die(
                OpenOptions::new().read(true).write(true).open(&floor_mutex),
                "open mutex",
            );
            or_die(m.lock(), "flock");
            atomic_write(dir, &floor_tmp, &floor_lock, &record);
            drop(m);
        })
    });
    grp.bench_function("leasehold_acquire_release", |b| {
        let mut builder = leasehold::LeaseBuilder::new(&lock).acquirer();
        b.iter(|| {
            let g = or_die(builder.try_acquire(), "try_acquire");
            or_die(g.release(), "release");
        })
    });

    grp.bench_function("floor_renew_in_place", |b| {
        b.iter(|| {
            let f = or_die(
                OpenOptions::new().read(true).write(true).open(&floor_lock),
                "open lease rw",
            );
            let n = or_die(f.read_at(&mut buf, 0), "read lease");
            or_die(f.write_all_at(&buf[..n.min(64)], 0), "pwrite header");
            drop(f);
        })
    });
    grp.bench_function("leasehold_renewal", |b| {
        let g = or_die(
            leasehold::LeaseBuilder::new(&lock)
                .ttl(Duration::from_secs(1))
                .heartbeat(Duration::from_nanos(1))
                .grace(Duration::from_millis(1))
                .try_acquire(),
            "acquire (renewal bench)",
        );
        b.iter_custom(|iters| {
            let s0 = g.lease().heartbeat_seq;
            let t = Instant::now();
            loop {
                std::thread::sleep(Duration::from_micros(100));
                let done = g.lease().heartbeat_seq - s0;
                if g.is_lost() {
                    eprintln!("ops bench: renewal guard lost: {:?}", g.loss());
                    std::process::exit(1);
                }
                if done >= iters {
                    // Scale the overshoot away: the rate is what counts.
                    return t.elapsed().mul_f64(iters as f64 / done as f64);
                }
            }
        });
        or_die(g.release(), "release (renewal bench)");
    });

    grp.bench_function("floor_status", |b| {
        b.iter(|| {
            open_flock_close(&floor_mutex);
            black_box(read_file(&floor_lock, &mut buf));
        })
    });
    grp.bench_function("leasehold_status", |b| {
        let g = or_die(leasehold::LeaseBuilder::new(&lock).try_acquire(), "acquire");
        b.iter(|| black_box(or_die(leasehold::status(&lock), "status")));
        or_die(g.release(), "release");
    });
    // The blocking path (`acquire()`, what `leasehold run` and every contender uses) builds a
    // waiter even when the lock is free; slow enough that it gets the minimum sample count.
    grp.sample_size(10);
    grp.bench_function("leasehold_acquire_blocking_release", |b| {
        let mut builder = leasehold::LeaseBuilder::new(&lock).acquirer();
        b.iter(|| {
            let g = or_die(builder.acquire(), "acquire");
            or_die(g.release(), "release");
        })
    });
    grp.finish();
    let _ = std::fs::remove_dir_all(dir);
}

fn scratch(base: PathBuf) -> PathBuf {
    base.join(format!("ops-{}", std::process::id()))
}

fn ops(c: &mut Criterion) {
    if Path::new("/dev/shm").is_dir() {
        bench_fs(c, "tmpfs", &scratch(PathBuf::from("/dev/shm")));
    }
    let disk = std::env::var_os("LEASEHOLD_BENCH_DISK")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(MANIFEST_DIR).join("target/bench-scratch"));
    bench_fs(c, "disk", &scratch(disk));
}

criterion_group! {
    name = benches;
    config = config();
    targets = ops
}
criterion_main!(benches);
