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

/// The mutex file's two lines: the durable ceiling, and the last token handed out below it.
fn mutex_lines(lock: &std::path::Path) -> (std::path::PathBuf, String) {
    let name = lock.file_name().unwrap().to_string_lossy();
    let path = lock.with_file_name(format!(".{name}.leasehold-mutex"));
    let text = std::fs::read_to_string(&path).expect("the mutex file");
    (path, text)
}

/// The ceiling in the mutex file's first line.
fn ceiling(text: &str) -> u64 {
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("leasehold-mutex 1 token "))
        .expect("first line")
        .parse()
        .expect("ceiling")
}

/// A directory on the project's disk (fsync is real there, so tokens come in durable blocks),
/// rather than [`support::tempdir`]'s tmpfs (a block of one).
fn disk_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("leasehold-tokens-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("create a tempdir on disk")
}

#[test]
fn tokens_skip_past_the_durable_ceiling_after_a_power_loss_or_an_older_writer() {
    for dir in [disk_tempdir(), support::tempdir()] {
        skip_past_the_ceiling(dir.path());
    }
}

#[test]
fn tokens_keep_increasing_within_a_durable_block_when_lock_is_deleted() {
    // On disk the ceiling is raised a block at a time; below it the last token handed out is
    // what a LOCK deleted by hand cannot take back.
    let dir = disk_tempdir();
    let lock = dir.path().join("block.lock");
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(acquire_in_child(&lock));
        std::fs::remove_file(&lock).unwrap();
    }
    seen.push(acquire_in_child(&lock));
    let (_, text) = mutex_lines(&lock);
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "not strictly increasing: {seen:?}; mutex file: {text}"
    );
    assert!(ceiling(&text) >= *seen.last().unwrap(), "{text}");
}

fn skip_past_the_ceiling(dir: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let lock = dir.join("ceiling.lock");
    let mut seen: Vec<u64> = (0..3).map(|_| acquire_in_child(&lock)).collect();
    let (path, text) = mutex_lines(&lock);
    let c = ceiling(&text);
    assert!(c >= *seen.iter().max().unwrap(), "{text}");

    // A power loss: the second line on disk is an older one (token 1) from another boot; and
    // LOCK is gone too. The next token must clear every token the ceiling covers.
    let second = text.lines().nth(1).expect("second line");
    let (_, boot) = second.split_once(" boot ").expect("boot id");
    let stale = second
        .replacen(&second[5..25], &format!("{:020}", 1), 1)
        .replace(boot.trim_end(), &"0".repeat(boot.trim_end().len()));
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(format!("{stale}\n").as_bytes(), 45).unwrap();
    std::fs::remove_file(&lock).unwrap();
    let t = acquire_in_child(&lock);
    assert!(t > c, "after a power loss: token {t}, ceiling was {c}");
    seen.push(t);

    // An older leasehold knows only the first line: it hands out max(first line, LOCK) + 1
    // and writes that there. The second line no longer names the ceiling, so it is not trusted.
    let (_, text) = mutex_lines(&lock);
    let older = ceiling(&text) + 100;
    f.write_all_at(
        format!("leasehold-mutex 1 token {older:020}\n").as_bytes(),
        0,
    )
    .unwrap();
    std::fs::remove_file(&lock).unwrap();
    let t = acquire_in_child(&lock);
    assert!(
        t > older,
        "after an older writer: token {t}, it handed out {older}"
    );
    seen.push(t);
    seen.push(acquire_in_child(&lock));
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "not strictly increasing: {seen:?}"
    );
}
