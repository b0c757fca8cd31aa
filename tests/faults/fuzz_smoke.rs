//! Fuzzing the lease parser under plain `cargo test` (cargo-fuzz needs nightly): the
//! committed corpus (fuzz/corpus/lease_parse) plus a few thousand mutations of it (bit flips,
//! truncations, splices, random insertions, digit and quote swaps) and random byte strings,
//! each written to LOCK and judged with `leasehold::status`, the public entry point of the
//! parser. Never a panic; only a verdict, "not a lease" or "newer format"; whitespace is free;
//! a newer format is claimed only for JSON whose "leasehold" is above 1; LOCK never changes.
//! Every outcome class must occur (a verdict, "free" for empty or white-space LOCK, "not a
//! lease", "newer format"), and the mutations alone must reach all but "free": a parser that
//! judged everything alike, or mutations that never got past it, would otherwise pass.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::support::Rng;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/lease_parse");
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    assert!(v.len() >= 5, "corpus too small");
    v
}

fn mutate(rng: &mut Rng, seeds: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = seeds[rng.below(seeds.len() as u64) as usize].1.clone();
    for _ in 0..=rng.below(4) {
        let len = b.len().max(1) as u64;
        match rng.below(8) {
            0 if !b.is_empty() => {
                let i = rng.below(len) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            1 => b.truncate(rng.below(len + 1) as usize),
            2 => {
                let other = &seeds[rng.below(seeds.len() as u64) as usize].1;
                let cut = rng.below(len + 1) as usize;
                let from = rng.below(other.len() as u64 + 1) as usize;
                b.truncate(cut.min(b.len()));
                b.extend_from_slice(&other[from..]);
            }
            3 => {
                let i = rng.below(len + 1) as usize;
                let n = rng.below(16) as usize;
                let ins: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
                b.splice(i.min(b.len())..i.min(b.len()), ins);
            }
            4 if !b.is_empty() => {
                // Change a digit: tokens, pids, sequence numbers, ttl, version.
                let digits: Vec<usize> = (0..b.len()).filter(|&i| b[i].is_ascii_digit()).collect();
                if !digits.is_empty() {
                    let i = digits[rng.below(digits.len() as u64) as usize];
                    b[i] = b"0123456789"[rng.below(10) as usize];
                }
            }
            5 if !b.is_empty() => {
                let i = rng.below(len) as usize;
                b[i] = *b"\"{}[],:\\ \n0-".get(rng.below(12) as usize).unwrap();
            }
            6 => {
                let s = String::from_utf8_lossy(&b)
                    .replace("\"leasehold\": 1", "\"leasehold\": 18446744073709551615");
                b = s.into_bytes();
            }
            _ => {
                let n = rng.below(64) as usize;
                b = (0..n).map(|_| rng.below(256) as u8).collect();
            }
        }
    }
    b
}

/// Outcome classes of `leasehold::status`.
const CLASSES: [&str; 4] = ["verdict", "free", "not a lease", "newer format"];

/// Judges `data` written to `lock`; returns its outcome class (an index into [`CLASSES`]).
fn check(lock: &Path, data: &[u8]) -> Result<usize, String> {
    std::fs::write(lock, data).map_err(|e| e.to_string())?;
    let r = std::panic::catch_unwind(|| leasehold::status(lock));
    let r = r.map_err(|_| "status panicked".to_string())?;
    let class = match r {
        Ok(v) => {
            let blank = data.iter().all(u8::is_ascii_whitespace);
            if blank && v.state != leasehold::State::Free {
                return Err(format!("whitespace judged {v}"));
            }
            if blank { 1 } else { 0 }
        }
        Err(leasehold::Error::NotALease { .. }) => 2,
        Err(leasehold::Error::NewerFormat { found, .. }) => {
            let ok = serde_json::from_slice::<serde_json::Value>(data)
                .ok()
                .and_then(|v| v["leasehold"].as_u64())
                .is_some_and(|v| v == found && v > 1);
            if !ok {
                return Err(format!("claimed newer format {found}"));
            }
            3
        }
        Err(e) => return Err(format!("unexpected error: {e}")),
    };
    if std::fs::read(lock).map_err(|e| e.to_string())? != data {
        return Err("status changed LOCK".into());
    }
    Ok(class)
}

#[test]
fn lease_parser_never_panics_on_corpus_and_mutations() {
    let seeds = corpus();
    let n = support::scaled(3000);
    let mut rng = Rng::new("fuzz smoke");
    let mut inputs: Vec<Vec<u8>> = seeds.iter().map(|s| s.1.clone()).collect();
    inputs.extend((0..n).map(|_| mutate(&mut rng, &seeds)));
    // Damaged records are re-read for a while (torn-read detection sleeps), so spread the inputs
    // over threads: the time is spent sleeping, not computing.
    let inputs = Arc::new(inputs);
    let next = Arc::new(Mutex::new(0usize));
    type Failures = Arc<Mutex<Vec<(String, Vec<u8>)>>>;
    let failures: Failures = Arc::default();
    // Per class: (corpus inputs, mutations) that fell in it.
    let classes: Arc<Mutex<[(usize, usize); 4]>> = Arc::default();
    let corpus_len = seeds.len();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (inputs, next, failures) = (inputs.clone(), next.clone(), failures.clone());
            let classes = classes.clone();
            std::thread::spawn(move || {
                let dir = tempfile::tempdir().unwrap();
                let lock: PathBuf = dir.path().join("job.lock");
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(data) = inputs.get(i) else { break };
                    match check(&lock, data) {
                        Ok(c) if i < corpus_len => classes.lock().unwrap()[c].0 += 1,
                        Ok(c) => classes.lock().unwrap()[c].1 += 1,
                        Err(why) => failures.lock().unwrap().push((why, data.clone())),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    let classes = *classes.lock().unwrap();
    let seen: Vec<String> = CLASSES
        .iter()
        .zip(classes)
        .map(|(name, (c, m))| format!("{name}: corpus {c}, mutations {m}"))
        .collect();
    println!(
        "faults: fuzz smoke: inputs={} (corpus {} + {n} mutations) failures={}; {}",
        inputs.len(),
        seeds.len(),
        failures.len(),
        seen.join("; ")
    );
    if let Some((why, data)) = failures.first() {
        let keep = std::env::temp_dir().join("leasehold-fuzz-failure");
        let _ = std::fs::write(&keep, data);
        panic!(
            "{} failure(s); first: {why} (input saved to {}): {:?}",
            failures.len(),
            keep.display(),
            String::from_utf8_lossy(data)
        );
    }
    for (i, (name, (c, m))) in CLASSES.iter().zip(classes).enumerate() {
        assert!(c + m > 0, "no input was judged `{name}`: {seen:?}");
        // "free" needs an all-white-space LOCK, which random mutations do not make.
        assert!(
            CLASSES[i] == "free" || m > 0,
            "no mutation was judged `{name}`: {seen:?}"
        );
    }
}
