//! Process state read from /proc directly, independently of the library under test. Zombies
//! count as dead (PID 1 on these machines does not reap orphans); a stopped process (`T`) is
//! alive but not running.

use std::fs;

/// Fields of /proc/PID/stat after the command name: index 0 is the state (field 3), index 19
/// the start time (field 22).
pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The state letter of a process, or None when it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// Start time (field 22) of a process, to tell PID reuse.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// State letter and start time.
pub fn stat(pid: i32) -> Option<(char, u64)> {
    Some((proc_state(pid)?, start_time(pid)?))
}

/// Alive = exists and is not a zombie. A SIGSTOPped process is alive: to check that a process
/// "was not signalled", use [`not_signalled`].
pub fn alive(pid: i32) -> bool {
    matches!(proc_state(pid), Some(c) if !matches!(c, 'Z' | 'X' | 'x'))
}

/// Dead: gone or a zombie.
pub fn is_dead(pid: i32) -> bool {
    !alive(pid)
}

/// Stopped (SIGSTOP or a tracing stop): alive, but not running.
pub fn is_stopped(pid: i32) -> bool {
    matches!(proc_state(pid), Some('T' | 't'))
}

/// Alive and not stopped.
pub fn running(pid: i32) -> bool {
    alive(pid) && !is_stopped(pid)
}

/// Neither killed nor stopped: what a "was not signalled" check needs, since a SIGSTOP (or
/// SIGTSTP, SIGTTIN, SIGTTOU) leaves a process [`alive`].
pub fn not_signalled(pid: i32) -> bool {
    running(pid)
}

/// Whether the process recorded as (pid, start) still runs (exists, same start, not a zombie).
pub fn proc_alive(pid: i32, start: u64) -> bool {
    matches!(stat(pid), Some((s, st)) if st == start && !matches!(s, 'Z' | 'X' | 'x'))
}

/// Every pid in /proc now.
pub fn pids() -> Vec<i32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect()
}

/// Live (non-zombie) members of a process group.
pub fn group(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for pid in pids() {
        let Some(f) = stat_fields(pid) else { continue };
        if f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
            && !matches!(f.first().map(String::as_str), Some("Z" | "X"))
        {
            out.push(pid);
        }
    }
    out
}

/// A PID that certainly named a process a moment ago and now names none (a reaped child).
pub fn dead_pid() -> i32 {
    let mut c = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = c.id() as i32;
    c.wait().expect("wait true");
    pid
}

/// Real uid of a process, from /proc/PID/status.
pub fn uid(pid: i32) -> Option<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Process group of a process (field 5 of /proc/PID/stat).
pub fn pgrp(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(2)?.parse().ok()
}
