//! What leasehold prints cannot be steered by what is in a lease or a path: control characters,
//! escape sequences, C1 controls, bidi overrides and CR/LF in the note, command, user, host,
//! ended fields and in LOCK's directory name reach `status`, the wait line, `break` and fencing
//! lines, and error lines only escaped — no raw control byte, no forged `leasehold:` line —,
//! commands are shown shell-quoted as typed, and `status --json` still carries the raw values
//! (its text escaping every terminal control, C1 and bidi ones included, as `\u` sequences).
//! Also: LOCK names at the 255-byte limit work (helper names are shortened to fit), and longer
//! ones are a usage error naming the limit.

use std::ffi::OsStr;
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::support::*;
use serde_json::Value;

/// An OSC window-title rewrite, a screen clear, a CSI via C1, a bidi override and a forged line.
const NOTE: &str = "note\u{1b}]0;pwned\u{7}\u{1b}[2J\r\nleasehold: forged note\u{202e}cba";
const USER: &str = "eve\u{1b}[2J\u{9b}31m";
const HOST: &str = "web1\r\nleasehold: forged host\u{2066}";
const WORD1: &str = "\u{1b}]0;pwned\u{7}";
const WORD2: &str = "x\nleasehold: forged word\u{85}";
const HOW: &str = "exit 0\u{1b}[2J\nleasehold: forged how";
const BY: &str = "mallory\u{1b}]0;pwned\u{7}\u{2028}leasehold: forged by";
const AT: &str = "2026-01-01T00:00:00.000000Z\u{1b}[1A\r";
/// A directory name with control characters: every path in every message goes through it.
const DIR: &str = "d\u{1b}]0;pwned\u{7}\r\nleasehold: forged dir\u{202e}";
/// The script of the genuine holder's command: `sh -c SCRIPT WORD1 WORD2` (sh ignores the words).
const SCRIPT: &str = "read x; exit 0";

fn is_bidi(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}

/// Asserts that `out` holds nothing a terminal would act on: no byte below 0x20 but `\n`, no
/// DEL, no C1 control and no bidi or line-separator control.
#[track_caller]
fn assert_terminal_safe(what: &str, out: &[u8]) {
    let text = String::from_utf8_lossy(out);
    for (i, &b) in out.iter().enumerate() {
        assert!(
            (b >= 0x20 || b == b'\n') && b != 0x7f,
            "{what}: raw control byte {b:#04x} at {i}:\n{text:?}"
        );
    }
    let s = std::str::from_utf8(out).unwrap_or_else(|e| panic!("{what}: not UTF-8 ({e})"));
    for c in s.chars() {
        assert!(
            !('\u{80}'..='\u{9f}').contains(&c) && !is_bidi(c),
            "{what}: raw control {c:?}:\n{s:?}"
        );
    }
}

/// The lines of `out` that start with `leasehold:`, after asserting that none is forged.
#[track_caller]
fn leasehold_lines(what: &str, out: &[u8]) -> Vec<String> {
    let s = String::from_utf8_lossy(out);
    let lines: Vec<String> = s
        .lines()
        .filter(|l| l.starts_with("leasehold:"))
        .map(str::to_string)
        .collect();
    assert!(
        !s.lines()
            .any(|l| l.trim_start().starts_with("leasehold: forged")),
        "{what}: a forged line stands on its own:\n{s}"
    );
    lines
}

/// Both streams are safe; returns stderr's `leasehold:` lines.
#[track_caller]
fn checked(what: &str, o: &Output) -> Vec<String> {
    assert_terminal_safe(&format!("{what} stdout"), &o.stdout);
    assert_terminal_safe(&format!("{what} stderr"), &o.stderr);
    assert!(
        leasehold_lines(&format!("{what} stdout"), &o.stdout).is_empty(),
        "{what}: stdout has a leasehold: line"
    );
    leasehold_lines(&format!("{what} stderr"), &o.stderr)
}

fn run_lh(args: &[&OsStr]) -> Output {
    lh().args(args).output().expect("run leasehold")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A fresh directory whose name holds control characters, inside a temp dir.
fn hostile_dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join(DIR);
    fs::create_dir(&dir).unwrap();
    (d, dir)
}

/// A readable status block: the first line is the (escaped) path, every other line a field.
#[track_caller]
fn assert_status_block_shape(o: &Output) {
    let s = String::from_utf8_lossy(&o.stdout);
    let mut lines = s.lines();
    let first = lines.next().expect("a status line");
    assert!(
        first.contains("\\x1b]0;pwned\\x07\\r\\nleasehold: forged dir\\u{202e}"),
        "{first}"
    );
    for l in lines {
        assert!(
            l.starts_with("  "),
            "a value started a line of its own: {l:?}\n{s}"
        );
    }
}

/// A lease of pid 4242 on `host` (boot `boot`) whose user, command and note are hostile.
fn forged(state: leasehold::LeaseState, host: &str, boot: &str) -> leasehold::Lease {
    let who = leasehold::Identity {
        host: host.into(),
        boot_id: boot.into(),
        pid_ns: 1,
        uid: nix::unistd::getuid().as_raw(),
        user: USER.into(),
    };
    let mut l = crafted(4242, 1, &who, Duration::from_secs(60), 41);
    l.state = state;
    l.lease_id = "0123456789abcdef0123456789abcdef".into();
    l.acquired_at = AT.into();
    l.holder.command = ["sh", "-c", "a; b", WORD1, WORD2]
        .map(String::from)
        .to_vec();
    l.holder.note = Some(NOTE.into());
    l
}

/// `run -w 0.3 LOCK -- true` against a live holder: exit 75 with one safe error line. Returns
/// the first wait line.
#[track_caller]
fn contended_run(lock: &Path) -> String {
    let wait = run_lh(&[
        os("run"),
        os("-w"),
        os("0.3"),
        lock.as_os_str(),
        os("--"),
        os("true"),
    ]);
    assert_eq!(wait.status.code(), Some(75), "{wait:?}");
    let lines = checked("contended run", &wait);
    assert_eq!(lines.len(), 1, "one error line: {lines:?}");
    let err = String::from_utf8_lossy(&wait.stderr);
    err.lines()
        .find(|l| l.starts_with("Blocking waiting for lock "))
        .unwrap_or_else(|| panic!("no wait line:\n{err}"))
        .to_string()
}

/// `break LOCK` of a live holder is refused (75, one safe line); `break --force` works (0):
/// its one safe line.
#[track_caller]
fn refused_then_forced_break(lock: &Path) -> String {
    let refused = run_lh(&[os("break"), lock.as_os_str()]);
    assert_eq!(refused.status.code(), Some(75), "{refused:?}");
    assert_eq!(checked("refused break", &refused).len(), 1);
    let broke = run_lh(&[os("break"), os("--force"), lock.as_os_str()]);
    assert_eq!(broke.status.code(), Some(0), "{broke:?}");
    let lines = checked("forced break", &broke);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.into_iter().next().unwrap()
}

#[test]
fn a_live_holder_with_a_hostile_note_and_command_cannot_write_to_the_terminal() {
    let (_d, dir) = hostile_dir();
    let lock = dir.join("job\u{9b}2J.lock");
    let mut holder = Proc::spawn(
        lh().args([os("run"), os("--ttl"), os("2s"), os("--note"), os(NOTE)])
            .arg(&lock)
            .args(["--", "sh", "-c", SCRIPT, WORD1, WORD2])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "hostile holder",
    );
    wait_for_child(&lock);
    let quoted =
        format!("sh -c '{SCRIPT}' $'\\x1b]0;pwned\\x07' $'x\\nleasehold: forged word\\u0085'");

    let st = run_lh(&[os("status"), lock.as_os_str()]);
    assert_eq!(st.status.code(), Some(0), "{st:?}");
    assert!(checked("status", &st).is_empty());
    assert_status_block_shape(&st);
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(
        text.contains(&quoted),
        "command not shown as typed:\n{text}"
    );
    assert!(
        text.contains("note\\x1b]0;pwned\\x07\\x1b[2J\\r\\nleasehold: forged note\\u{202e}cba"),
        "{text}"
    );

    let js = run_lh(&[os("status"), os("--json"), lock.as_os_str()]);
    assert_eq!(js.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&js.stdout).expect("status --json parses");
    assert_eq!(v["note"], NOTE);
    assert_eq!(
        v["command"],
        serde_json::json!(["sh", "-c", SCRIPT, WORD1, WORD2])
    );
    assert_eq!(v["path"], lock.to_str().unwrap());

    let blocking = contended_run(&lock);
    assert!(blocking.contains("(sh -c 'read x; exit 0'"), "{blocking}");

    let line = refused_then_forced_break(&lock);
    // A live lease is revoked, not freed (it blocks until its holder has fenced).
    assert!(
        line.starts_with("leasehold: revoked held lease of pid "),
        "{line}"
    );

    // The holder notices at its next renewal and fences its command.
    let code = holder.wait_timeout(Duration::from_secs(20)).code();
    let err = holder.stderr();
    assert_eq!(code, Some(74), "{err}");
    assert_terminal_safe("fenced holder stderr", err.as_bytes());
    let lines = leasehold_lines("fenced holder", err.as_bytes());
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with(&format!("leasehold: fenced {quoted}: ")),
        "{err}"
    );

    let after = run_lh(&[os("status"), lock.as_os_str()]);
    assert!(checked("status after the break", &after).is_empty());
    assert_status_block_shape(&after);
}

#[test]
fn forged_released_lease_fields_are_shown_escaped_and_kept_raw_in_json() {
    let (_d, dir) = hostile_dir();
    let lock = dir.join("released.lock");
    let mut l = forged(leasehold::LeaseState::Released, HOST, "other-boot");
    l.ended = Some(leasehold::Ending {
        at: AT.into(),
        how: HOW.into(),
        by: Some(BY.into()),
    });
    fs::write(&lock, l.to_bytes()).unwrap();

    let st = run_lh(&[os("status"), lock.as_os_str()]);
    assert_eq!(st.status.code(), Some(0), "{st:?}");
    assert!(checked("status", &st).is_empty());
    assert_status_block_shape(&st);
    let text = String::from_utf8_lossy(&st.stdout);
    for want in [
        "eve\\x1b[2J\\u{9b}31m@web1\\r\\nleasehold: forged host\\u{2066} pid 4242",
        "sh -c 'a; b' $'\\x1b]0;pwned\\x07'",
        "exit 0\\x1b[2J\\nleasehold: forged how by mallory\\x1b]0;pwned\\x07\\u{2028}leasehold: forged by at 2026-01-01T00:00:00.000000Z\\x1b[1A\\r",
    ] {
        assert!(text.contains(want), "lacks {want:?}:\n{text}");
    }

    let js = run_lh(&[os("status"), os("--json"), lock.as_os_str()]);
    assert_eq!(js.status.code(), Some(0));
    // JSON text is safe on a terminal too: C1, bidi and line separators as \u escapes.
    assert_terminal_safe("status --json", &js.stdout);
    let v: Value = serde_json::from_slice(&js.stdout).expect("status --json parses");
    assert_eq!(
        (v["user"].as_str(), v["host"].as_str()),
        (Some(USER), Some(HOST)),
        "{v}"
    );
    assert_eq!(v["note"], NOTE);
    assert_eq!(v["acquired_at"], AT);
    assert_eq!(
        v["command"],
        serde_json::json!(["sh", "-c", "a; b", WORD1, WORD2])
    );
    let e = &v["ended"];
    assert_eq!(
        (e["how"].as_str(), e["by"].as_str(), e["at"].as_str()),
        (Some(HOW), Some(BY), Some(AT))
    );
    // Nothing to break in a released lease: refused, in one safe line.
    let refused = run_lh(&[os("break"), lock.as_os_str()]);
    assert_eq!(refused.status.code(), Some(75));
    assert_eq!(checked("break of a released lease", &refused).len(), 1);
}

#[test]
fn a_forged_live_holder_from_another_host_shows_escaped_in_wait_break_and_errors() {
    let (_d, dir) = hostile_dir();
    let lock = dir.join("held.lock");
    fs::write(
        &lock,
        forged(leasehold::LeaseState::Held, HOST, "other-boot").to_bytes(),
    )
    .unwrap();

    let blocking = contended_run(&lock);
    assert!(
        blocking.contains("held by eve\\x1b[2J\\u{9b}31m@web1\\r\\nleasehold: forged host\\u{2066} pid 4242 (sh -c 'a; b' "),
        "{blocking}"
    );

    let st = run_lh(&[os("status"), lock.as_os_str()]);
    assert!(checked("status", &st).is_empty());
    assert_status_block_shape(&st);

    let line = refused_then_forced_break(&lock);
    assert!(
        line.contains(" on web1\\r\\nleasehold: forged host\\u{2066} (token "),
        "{line}"
    );
}

#[test]
fn a_usage_error_quoting_a_hostile_argument_is_escaped() {
    let o = run_lh(&[
        os("run"),
        os("--ttl"),
        os(NOTE),
        os("/tmp/x.lock"),
        os("--"),
        os("true"),
    ]);
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    checked("usage error", &o);
    let o = run_lh(&[os("run"), os("/tmp/x.lock"), os("--"), os(WORD2)]);
    assert_eq!(o.status.code(), Some(127), "{o:?}");
    assert_eq!(checked("command not found", &o).len(), 1);
}

/// `name` bytes long, made of `fill` after `prefix`.
fn name_of(prefix: &str, fill: u8, len: usize) -> PathBuf {
    let mut b = prefix.as_bytes().to_vec();
    b.resize(len, fill);
    PathBuf::from(OsStr::from_bytes(&b))
}

fn listing(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    v.sort();
    v
}

#[test]
fn a_lock_name_of_255_bytes_works_for_run_status_and_break() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join(name_of("long-", b'n', 255));
    let run = run_lh(&[os("run"), lock.as_os_str(), os("--"), os("true")]);
    assert_eq!(run.status.code(), Some(0), "{run:?}");

    let mut holder = Proc::spawn(
        // A short TTL: the holder notices the break at its next renewal.
        lh().args(["run", "--ttl", "2s"])
            .arg(&lock)
            .args(["--", "sh", "-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "holder of the long name",
    );
    let (_, _, _) = wait_for_child(&lock);
    let st = run_lh(&[os("status"), lock.as_os_str()]);
    assert_eq!(st.status.code(), Some(0), "{st:?}");
    assert!(
        String::from_utf8_lossy(&st.stdout).contains(": held"),
        "{st:?}"
    );
    let id = lease(&lock).unwrap()["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    let broke = run_lh(&[os("break"), os("--lease-id"), os(&id), lock.as_os_str()]);
    assert_eq!(broke.status.code(), Some(0), "{broke:?}");
    assert_eq!(
        holder.wait_timeout(Duration::from_secs(20)).code(),
        Some(74)
    );
    drop(holder.child.stdin.take());

    let names = listing(d.path());
    let shown: Vec<_> = names.iter().map(|n| String::from_utf8_lossy(n)).collect();
    for part in [&b".leasehold-mutex"[..], b".leasehold-seen-"] {
        assert!(
            names
                .iter()
                .any(|n| n.windows(part.len()).any(|w| w == part)),
            "{shown:?}"
        );
    }
    for n in &names {
        assert!(n.len() <= 255, "{} bytes", n.len());
        assert!(
            n == lock.file_name().unwrap().as_bytes() || n.starts_with(b".long-n"),
            "a file that is neither LOCK nor one of its helpers: {:?}",
            String::from_utf8_lossy(n)
        );
    }
}

#[test]
fn a_lock_name_of_256_bytes_is_a_usage_error_naming_the_limit() {
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join(name_of("long-", b'n', 256));
    for args in [
        vec![os("run"), lock.as_os_str(), os("--"), os("true")],
        vec![os("status"), lock.as_os_str()],
        vec![os("break"), lock.as_os_str()],
    ] {
        let o = run_lh(&args);
        assert_eq!(o.status.code(), Some(64), "{o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("256 bytes") && err.contains("255"), "{err}");
    }
    assert!(listing(d.path()).is_empty(), "nothing is created");
}

#[test]
fn long_lock_names_sharing_a_prefix_get_helpers_of_their_own() {
    let d = tempfile::tempdir().unwrap();
    let common = "p".repeat(200);
    let a = d.path().join(name_of(&format!("{common}a"), b'a', 255));
    let b = d.path().join(name_of(&format!("{common}b"), b'b', 255));
    // A holds its lock while B is taken: with a shared mutex or temp file they would still
    // take turns, so compare the helper files themselves too.
    let mut holder = Proc::spawn(
        lh().arg("run")
            .arg(&a)
            .args(["--", "sh", "-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "holder of A",
    );
    wait_for_child(&a);
    let o = run_lh(&[os("run"), os("-n"), b.as_os_str(), os("--"), os("true")]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    if let Some(mut i) = holder.child.stdin.take() {
        let _ = i.write_all(b"done\n");
    }
    assert_eq!(holder.wait_timeout(Duration::from_secs(20)).code(), Some(0));
    let mutexes: Vec<Vec<u8>> = listing(d.path())
        .into_iter()
        .filter(|n| n.ends_with(b".leasehold-mutex"))
        .collect();
    assert_eq!(mutexes.len(), 2, "{mutexes:?}");
    assert_ne!(mutexes[0], mutexes[1]);
}
