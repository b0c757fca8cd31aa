//! Torn reads are never acted on.
//!
//! A holder process renews every 1 ms (rewriting the lease header in place) while this process
//! does 100,000 `leasehold::status` reads. Proves: zero errors and zero invalid leases (every
//! read is this holder's lease, held, with a well-formed time and a heartbeat sequence that never
//! goes backwards), while the sequence is seen moving thousands of times — so a torn read had
//! every chance to show. A raw reader beside it counts how often plain `read()`s of LOCK do tear
//! (by the record's own checksum).
//!
//! Renewals every 1 ms tear a plain read only rarely (the first test prints how often, and may
//! see none), so a second test makes sure the check can fail: a writer thread rewrites a lease in place as fast
//! as it can, alternating two valid records of the same length, while `status` reads it. Raw
//! reads then tear often (asserted), and `status` must still only ever return one of the two.

use crate::support;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use leasehold::State;

const READS: usize = 100_000;

/// The two tests each load both cores; run them one after the other.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads LOCK with plain `read()`s until `stop`; returns (reads, torn, unparseable).
fn raw_reader(lock: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64, u64)> {
    raw_reader_counting(lock, stop, Arc::new(AtomicU64::new(0)))
}

/// [`raw_reader`], counting torn reads in `torn_so_far` as they happen.
fn raw_reader_counting(
    lock: PathBuf,
    stop: Arc<AtomicBool>,
    torn_so_far: Arc<AtomicU64>,
) -> std::thread::JoinHandle<(u64, u64, u64)> {
    std::thread::spawn(move || {
        let (mut reads, mut torn, mut bad) = (0u64, 0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let b = std::fs::read(&lock).unwrap();
            reads += 1;
            match checksum_ok(&b) {
                Some(true) => {}
                Some(false) => {
                    torn += 1;
                    torn_so_far.fetch_add(1, Ordering::Relaxed);
                }
                None => bad += 1,
            }
        }
        (reads, torn, bad)
    })
}

/// The record's checksum, as PROTOCOL.md describes it: FNV-1a over the bytes with the 16
/// checksum digits taken as '0', then a murmur3 finaliser.
fn checksum_ok(bytes: &[u8]) -> Option<bool> {
    let key = b"\"checksum\": \"";
    let at = bytes.windows(key.len()).position(|w| w == key)? + key.len();
    let digits = std::str::from_utf8(bytes.get(at..at + 16)?).ok()?;
    let want = u64::from_str_radix(digits, 16).ok()?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, &b) in bytes.iter().enumerate() {
        let b = if (at..at + 16).contains(&i) { b'0' } else { b };
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    Some(h ^ (h >> 33) == want)
}

/// Fails, showing the first five, unless `found` (errors, invalid reads) is empty.
#[track_caller]
fn assert_none(what: &str, found: &[String]) {
    assert!(
        found.is_empty(),
        "{} {what}, first: {:?}",
        found.len(),
        &found[..found.len().min(5)]
    );
}

#[test]
fn status_reads_never_see_a_torn_lease_under_1ms_renewals() {
    let _serial = serial();
    let dir = support::tempdir();
    let lock = dir.path().join("torn.lock");
    // TTL 1 s rather than 100 ms: the 1 ms heartbeat is what makes reads and writes collide; the
    // longer TTL only keeps a scheduling hiccup on a loaded 2-core machine from losing the lease.
    let (mut holder, _token, lease_id) = support::spawn_holder(
        &lock,
        Duration::from_millis(1000),
        &[("LH_HB_MS", "1".into())],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let raw = raw_reader(lock.clone(), Arc::clone(&stop));
    let started = Instant::now();
    let (mut errors, mut invalid) = (Vec::new(), Vec::new());
    let mut last_seq = 0u64;
    let mut moves = 0u64;
    let mut states = std::collections::BTreeMap::new();
    for i in 0..READS {
        let v = match leasehold::status(&lock) {
            Ok(v) => v,
            Err(e) => {
                errors.push(format!("read {i}: {e}"));
                continue;
            }
        };
        *states.entry(v.state.to_string()).or_insert(0usize) += 1;
        let Some(l) = v.lease.as_ref() else {
            invalid.push(format!("read {i}: no lease: {v}"));
            continue;
        };
        let ok = l.lease_id == lease_id
            && l.state == leasehold::LeaseState::Held
            && !l.damaged
            && l.heartbeat_seq >= last_seq
            && leasehold::parse_rfc3339(&l.heartbeat_at).is_some()
            && matches!(v.state, State::Held | State::Hung);
        if !ok {
            invalid.push(format!("read {i}: after seq {last_seq}: {l:?}"));
        }
        if l.heartbeat_seq > last_seq {
            moves += 1;
            last_seq = l.heartbeat_seq;
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (raw_reads, raw_torn, raw_bad) = raw.join().unwrap();
    holder.close_stdin();
    let end = holder.line("SEQ", Duration::from_secs(10));
    assert!(holder.wait_timeout(Duration::from_secs(10)).success());
    eprintln!(
        "torn reads: {READS} status reads in {took:.2?} ({:.0}/s): {} errors, {} invalid, verdicts {states:?}, \
         heartbeat seen moving {moves} times (last seq {last_seq}; holder ended at seq/lost {end}); \
         raw read()s beside it: {raw_reads}, torn {raw_torn} ({:.3} %), unparseable {raw_bad}",
        READS as f64 / took.as_secs_f64(),
        errors.len(),
        invalid.len(),
        100.0 * raw_torn as f64 / raw_reads.max(1) as f64,
    );
    assert_none("errors", &errors);
    assert_none("invalid", &invalid);
    assert!(
        moves >= 1_000,
        "heartbeat seen moving only {moves} times: the test proves nothing"
    );
    assert!(end.ends_with("false"), "the holder lost its lease: {end}");
    assert!(
        raw_bad == 0,
        "raw reads my checksum helper could not parse: {raw_bad}"
    );
}

#[test]
fn status_reads_never_see_a_torn_lease_under_in_place_hammering() {
    let _serial = serial();
    let dir = support::tempdir();
    let lock = dir.path().join("hammered.lock");
    let me = leasehold::Identity::current();
    let own = std::process::id() as i32;
    let (_, start) = support::stat(own).unwrap();
    // Records that differ in every variable byte, header and a long note alike, widen the window
    // in which a read and a write copy interleave.
    let mut a = support::crafted(own, start, &me, Duration::from_secs(60), 5);
    a.holder.note = Some("a".repeat(2000));
    let mut b = a.clone();
    b.holder.note = Some("b".repeat(2000));
    b.heartbeat_seq = 999_999_999;
    b.heartbeat_at = "2031-12-31T23:59:59.999999Z".into();
    let (ab, bb) = (a.to_bytes(), b.to_bytes());
    assert_eq!(
        ab.len(),
        bb.len(),
        "the two records must differ only in place"
    );
    std::fs::write(&lock, &ab).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (lock, stop, writes) = (lock.clone(), Arc::clone(&stop), Arc::clone(&writes));
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
            while !stop.load(Ordering::Relaxed) {
                f.write_all_at(&bb, 0).unwrap();
                f.write_all_at(&ab, 0).unwrap();
                writes.fetch_add(2, Ordering::Relaxed);
            }
        })
    };
    let torn_so_far = Arc::new(AtomicU64::new(0));
    let raw = raw_reader_counting(lock.clone(), Arc::clone(&stop), Arc::clone(&torn_so_far));
    // At least 20,000 status reads, and on until the raw reader has seen a read tear (for at
    // most 60 s): a tear needs the writer and a reader on two CPUs at once, which a loaded
    // machine (two cores, a build beside the test) can deny for the first 20,000.
    let mut reads = 0;
    let started = Instant::now();
    let (mut errors, mut invalid, mut saw) = (Vec::new(), Vec::new(), [0usize; 2]);
    while reads < 20_000
        || (torn_so_far.load(Ordering::Relaxed) == 0 && started.elapsed() < Duration::from_secs(60))
    {
        let i = reads;
        reads += 1;
        match leasehold::status(&lock) {
            Ok(v) => match v.lease.as_ref() {
                Some(l) if v.state == State::Held && !l.damaged && (*l == a || *l == b) => {
                    saw[usize::from(*l == b)] += 1
                }
                _ => invalid.push(format!("read {i}: {v}: {:?}", v.lease)),
            },
            Err(e) => errors.push(format!("read {i}: {e}")),
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let (raw_reads, raw_torn, raw_bad) = raw.join().unwrap();
    eprintln!(
        "torn reads, hammered: {reads} status reads in {took:.2?} against {} in-place rewrites: {} errors, \
         {} invalid, saw record A {} and B {} times; raw read()s beside it: {raw_reads}, torn {raw_torn} \
         ({:.2} %), unparseable {raw_bad}",
        writes.load(Ordering::Relaxed),
        errors.len(),
        invalid.len(),
        saw[0],
        saw[1],
        100.0 * raw_torn as f64 / raw_reads.max(1) as f64,
    );
    assert_none("errors", &errors);
    assert_none("invalid", &invalid);
    assert!(
        saw[0] > 0 && saw[1] > 0,
        "only one record ever seen: {saw:?}"
    );
    assert!(
        raw_torn > 0,
        "no raw read tore: the hazard this test guards against did not occur"
    );
    assert_eq!(raw_bad, 0);
}
