//! Fencing tokens survive LOCK being emptied, replaced or deleted: acquire and
//! release a few times, then truncate LOCK to 0 bytes (`truncate -s 0`), replace it with an empty
//! file, or delete it: every next acquisition still gets a token greater than all before, across
//! separate processes.

use crate::support;

use std::time::Duration;

use crate::support::Proc;
use leasehold::LeaseBuilder;

fn acquire_in_child(lock: &std::path::Path) -> u64 {
    let mut c = support::worker::cmd("oneshot");
    c.env("LH_LOCK", lock).env("LH_TTL_MS", "5000");
    let mut p = Proc::spawn_piped(c, "one-shot");
    let out = p.line("OUTCOME", Duration::from_secs(10));
    assert!(p.wait_timeout(Duration::from_secs(10)).success());
    out.strip_prefix("acquired ")
        .unwrap_or_else(|| panic!("expected to acquire: {out}"))
        .parse()
        .unwrap()
}

#[test]
fn tokens_keep_increasing_when_lock_is_emptied_or_replaced() {
    let dir = support::tempdir();
    let lock = dir.path().join("tokens.lock");
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(acquire_in_child(&lock));
    }
    let g = LeaseBuilder::new(&lock).try_acquire().unwrap();
    seen.push(g.token());
    g.release().unwrap();
    let mut emptied = Vec::new();
    for how in ["truncate -s 0", "replace with an empty file", "delete"] {
        match how {
            "truncate -s 0" => {
                let st = std::process::Command::new("truncate")
                    .args(["-s", "0"])
                    .arg(&lock)
                    .status()
                    .unwrap();
                assert!(st.success());
                assert_eq!(std::fs::metadata(&lock).unwrap().len(), 0);
                assert_eq!(
                    leasehold::status(&lock).unwrap().state,
                    leasehold::State::Free
                );
            }
            "replace with an empty file" => support::write_atomic(&lock, b""),
            _ => std::fs::remove_file(&lock).unwrap(),
        }
        let t = acquire_in_child(&lock);
        let max = *seen.iter().max().unwrap();
        emptied.push((how, max, t));
        assert!(
            t > max,
            "after `{how}`: token {t}, but {max} was handed out before"
        );
        seen.push(t);
        seen.push(acquire_in_child(&lock));
    }
    eprintln!("tokens: {seen:?}; after emptying (how, max before, next): {emptied:?}");
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "not strictly increasing: {seen:?}"
    );
}
