//! What script mode (`leasehold lock`) needs to know of the script it holds a lease for: its
//! controlling terminal, its command line, and whether another process descends from it.
//!
//! Owns: reading `/proc/PID/stat` field 7 (`tty_nr`), `/proc/PID/cmdline`, the parent chain,
//! and finding a descriptor of a process that leads to its terminal. Must never: signal
//! anything, or answer "yes" on a /proc entry it could not read.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use super::stat;

/// The controlling terminal of `pid` (`tty_nr`, the device number), or `None` when it has none
/// or /proc cannot be read.
pub fn controlling_tty(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // state, ppid, pgrp, session, tty_nr
    let tty: i64 = rest.split_whitespace().nth(4)?.parse().ok()?;
    (tty != 0).then_some(tty as u64)
}

/// The name of `pid`'s controlling terminal, as an operator knows it: `/dev/pts/3` (the link of
/// a descriptor of `pid` that leads to it, when readable), else decoded from `tty_nr` (`pts/3`,
/// `tty2`, `ttyS0`, or `tty 4:70`). `None` without one.
pub fn tty_name(pid: i32) -> Option<String> {
    let tty = controlling_tty(pid)?;
    if let Some(link) = terminal_path(pid).and_then(|p| fs::read_link(p).ok()) {
        return Some(link.display().to_string());
    }
    // linux/kdev_t.h's new_decode_dev.
    let major = (tty >> 8) & 0xfff;
    let minor = (tty & 0xff) | ((tty >> 12) & 0xfff00);
    Some(match major {
        136..=143 => format!("pts/{}", (major - 136) * 256 + minor),
        4 if minor < 64 => format!("tty{minor}"),
        4 => format!("ttyS{}", minor - 64),
        _ => format!("tty {major}:{minor}"),
    })
}

/// Whether `pid` is the process `ancestor` (with start time `start`) or one of its
/// descendants, walking the parent chain in /proc. False when the chain cannot be read.
pub fn descends_from(pid: i32, ancestor: i32, start: u64) -> bool {
    let mut at = pid;
    // Bounded: /proc could change under us.
    for _ in 0..4096 {
        let Ok(Some(s)) = stat(at) else {
            return false;
        };
        if s.pid == ancestor {
            return s.start == start;
        }
        if s.ppid <= 0 {
            return false;
        }
        at = s.ppid;
    }
    false
}

/// The command line of `pid` (lossy UTF-8), empty when it cannot be read.
pub fn cmdline(pid: i32) -> Vec<String> {
    let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return Vec::new();
    };
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// A `/proc/PID/fd/N` path of one of the standard descriptors (2, 1, 0) of `pid` that leads to
/// its controlling terminal, for telling it something there. `None` without one.
pub fn terminal_path(pid: i32) -> Option<PathBuf> {
    let tty = controlling_tty(pid)?;
    [2, 1, 0].into_iter().find_map(|fd| {
        let p = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
        let m = fs::metadata(&p).ok()?;
        (m.file_type().is_char_device() && m.rdev() == tty).then_some(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_descends_from_its_parent_and_not_from_a_stranger_start_time() {
        let me = std::process::id() as i32;
        let parent = stat(me).unwrap().unwrap().ppid;
        let ps = stat(parent).unwrap().unwrap();
        assert!(descends_from(me, parent, ps.start));
        assert!(!descends_from(me, parent, ps.start + 1));
        assert!(!cmdline(me).is_empty());
    }
}
