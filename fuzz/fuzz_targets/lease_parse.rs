//! Fuzzes the lease parser through its public entry point: the bytes become LOCK, and
//! `leasehold::status` must never panic, must only ever answer a verdict or "not a lease" /
//! "newer format", and must never change LOCK. tests/faults_fuzz_smoke.rs runs the same check
//! on the committed corpus and mutations under plain `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("tempdir");
    let lock = dir.path().join("job.lock");
    std::fs::write(&lock, data).expect("write LOCK");
    match leasehold::status(&lock) {
        Ok(v) => {
            if data.iter().all(u8::is_ascii_whitespace) {
                assert_eq!(v.state, leasehold::State::Free);
            }
        }
        Err(leasehold::Error::NotALease { .. } | leasehold::Error::NewerFormat { .. }) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
    assert_eq!(
        std::fs::read(&lock).expect("read LOCK"),
        data,
        "status changed LOCK"
    );
});
