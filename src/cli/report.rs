//! What `leasehold` prints: every line and block a person reads, in one place.
//!
//! Owns: the wording of the contention line, break lines, the fencing line, error lines and the
//! readable `status` block, and making each safe to show: every value taken from a lease or a
//! path is escaped ([`text::escape`]), commands are shell-quoted ([`text::quote_argv`]), and text
//! that comes through the library's `Display` (verdicts, errors: partly escaped already) gets the
//! control-only pass ([`text::scrub`]). Must never: decide anything (exit statuses, whether to
//! print at all under `-q`): callers do; print itself: it only formats; or return a line holding
//! a control character.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use leasehold::text::{self, escape, escape_path, scrub};
use leasehold::{
    AtTerminal, Broken, Error, Frees, LastEnding, Lease, LeaseState, State, TimingError, Verdict,
    human_duration,
};

/// `leasehold: <error>`.
pub fn error_line(e: &Error) -> String {
    if let Error::Timing(t) = e {
        return format!("leasehold: invalid settings: {}", timing_text(t));
    }
    if let Some(line) = permission_line(e) {
        return line;
    }
    scrub(&format!("leasehold: {e}")).into_owned()
}

/// A permission error on one of the files leasehold keeps beside LOCK, in the user's terms:
/// `leasehold: permission denied: leasehold needs write access to DIR (it keeps
/// .NAME.leasehold-* files there); cannot create the mutex file DIR/.NAME.leasehold-mutex`.
/// `None` for any other error (a LOCK that cannot be read says so plainly).
fn permission_line(e: &Error) -> Option<String> {
    const EACCES: i32 = nix::errno::Errno::EACCES as i32;
    const EPERM: i32 = nix::errno::Errno::EPERM as i32;
    let Error::Io { path, op, source } = e else {
        return None;
    };
    if !matches!(source.raw_os_error(), Some(EACCES | EPERM)) {
        return None;
    }
    let helper = |p: &Path| -> Option<String> {
        let name = p.file_name()?.to_string_lossy();
        let rest = name.strip_prefix('.')?;
        Some(rest[..rest.find(".leasehold-")?].to_string())
    };
    let parent = path.parent()?;
    let (dir, lock) = if let Some(lock) = helper(path) {
        (parent, lock)
    } else if let Some(lock) = helper(parent) {
        // A ticket in the wait queue directory.
        (parent.parent()?, lock)
    } else if op.starts_with("create") || op.starts_with("rename") {
        (parent, path.file_name()?.to_string_lossy().into_owned())
    } else {
        return None;
    };
    Some(format!(
        "leasehold: permission denied: leasehold needs write access to {} (it keeps .{}.leasehold-* files there); cannot {} {}",
        escape_path(dir),
        escape(&lock),
        op,
        escape_path(path)
    ))
}

/// What is wrong with the timing, naming the flags to change (the library names the settings).
fn timing_text(t: &TimingError) -> String {
    match *t {
        TimingError::ZeroTtl => "--ttl must be greater than zero".into(),
        TimingError::ZeroHeartbeat => "--heartbeat must be greater than zero".into(),
        TimingError::TooLong { ttl } => format!(
            "--ttl {} is longer than the longest leasehold grants ({}): the TTL is how long a \
             silent holder is waited for, not how long the job may run",
            human_duration(ttl),
            human_duration(leasehold::MAX_TTL)
        ),
        TimingError::DoesNotFit {
            ttl,
            heartbeat,
            grace,
            margin,
            heartbeat_set,
            grace_set,
        } => {
            let flag = match (heartbeat_set, grace_set) {
                (true, false) => "--heartbeat",
                (false, true) => "--grace",
                (true, true) => "--heartbeat and --grace",
                (false, false) => "--ttl",
            };
            let d = human_duration;
            // The TTL alone (heartbeat and grace derived from it) is too short: only lengthening
            // it helps.
            let advice = if heartbeat_set || grace_set {
                format!("shorten {flag} or lengthen --ttl")
            } else {
                "lengthen --ttl".to_string()
            };
            format!(
                "{flag}: heartbeat {} + grace {} + safety margin {} must be less than the TTL {}; {advice}",
                d(heartbeat),
                d(grace),
                d(margin),
                d(ttl)
            )
        }
    }
}

/// `--generate` could not write its output.
pub fn stdout_error_line(e: &std::io::Error) -> String {
    scrub(&format!("leasehold: cannot write to stdout: {e}")).into_owned()
}

/// `run LOCK` with neither `-- CMD` nor `-c`.
pub fn no_command_line() -> String {
    "leasehold: no command: put it after `--`, or use -c 'SHELL COMMAND'".into()
}

/// `leasehold: <why>`, for a command that could not be started (`why` names it already).
pub fn not_started_line(why: &str) -> String {
    format!("leasehold: {}", scrub(why))
}

/// The cargo-style contention line, with the holder's `--note`:
/// `Blocking waiting for lock /srv/deploy.lock held by alice@web1 pid 4242 (terraform apply)
/// [note: CI run 5], heartbeat unchanged here for 3s, held 12m, token 17`.
pub fn blocking_line(v: &Verdict) -> String {
    let mut shown = v.to_string();
    if let Some(note) = v.lease.as_ref().and_then(|l| l.holder.note.as_ref())
        && v.state != State::Free
    {
        let holder = v.holder();
        let noted = format!("{holder} [note: {}]", escape(note));
        shown = shown.replacen(&holder, &noted, 1);
    }
    format!(
        "Blocking waiting for lock {} {}",
        escape_path(&v.path),
        scrub(&shown)
    )
}

/// [`blocking_line`] for a verdict judged `since` ago: its heartbeat age and "held" advanced by
/// that much, so that a spinner's line stays current between two looks at the lock (a waiter
/// looks again at least every TTL/4, at most 5s, and its new verdict replaces this one).
pub fn blocking_line_after(v: &Verdict, since: Duration) -> String {
    let mut v = v.clone();
    v.heartbeat_age = v.heartbeat_age.map(|a| a.saturating_add(since));
    v.judged_at = v.judged_at.checked_add(since).unwrap_or(v.judged_at);
    blocking_line(&v)
}

/// One line for a lease broken to take the lock, or by `leasehold break`:
/// `broke stale lease of pid 4242 on web1: process gone (token 17)`.
pub fn broke_line(v: &Verdict, was_live: bool) -> String {
    let Some(l) = &v.lease else {
        return format!(
            "leasehold: {}: nothing to break ({})",
            escape_path(&v.path),
            scrub(&v.reason)
        );
    };
    let h = &l.holder;
    let mut s = format!(
        "leasehold: broke {} lease of pid {} on {}: {} (token {})",
        v.state,
        h.pid,
        escape(&h.host),
        scrub(&v.reason),
        l.token
    );
    if was_live {
        s.push_str("; its holder will fence its command at its next renewal");
    }
    s
}

/// The line for `leasehold break`: what it did, and how long until the lock is free.
/// - `leasehold: broke stale lease of pid 4242 on web1: process gone (token 17)`
/// - `leasehold: revoked held lease of pid 4242 on web1 (token 17): holder alive on this host; it
///   will fence its command at its next renewal (last heartbeat written …); the lock frees when
///   its processes are gone (stopped as hung if still alive after its TTL 30s)`
/// - `leasehold: lease names pid 1, which is not a holder of this lock (…) (forged or copied
///   lease): replaced it without signalling anything (token 7)`
pub fn broken_line(b: &Broken) -> String {
    let v = &b.verdict;
    let Some(l) = &v.lease else {
        return broke_line(v, b.was_live);
    };
    let h = &l.holder;
    if let Some(forged) = &b.forged {
        return format!(
            "leasehold: {} (forged or copied lease): replaced it without signalling anything (token {}); the lock is free",
            scrub(forged),
            l.token
        );
    }
    let mut s = match b.written {
        LeaseState::Revoked => {
            let mut s = format!(
                "leasehold: {} {} lease of pid {} on {} (token {}): {}",
                if b.already_revoked {
                    "already revoked:"
                } else {
                    "revoked"
                },
                v.state,
                h.pid,
                escape(&h.host),
                l.token,
                scrub(&v.reason)
            );
            // A shell at a terminal is never fenced: `at_terminal` says what frees the lock.
            if b.at_terminal.is_none() {
                let _ = write!(
                    s,
                    "; it will fence its command at its next renewal (last heartbeat written {})",
                    escape(&l.heartbeat_at)
                );
            }
            match b.frees {
                _ if b.at_terminal.is_some() => {}
                Frees::WhenGone { ttl } => {
                    let _ = write!(
                        s,
                        "; the lock frees when its processes are gone (stopped as hung if still alive {} after the break)",
                        human_duration(ttl)
                    );
                }
                Frees::AfterTtl { ttl } => {
                    let _ = write!(
                        s,
                        "; the lock frees after at most its TTL {} on each contender's clock",
                        human_duration(ttl)
                    );
                }
                Frees::Now => {}
            }
            s
        }
        _ => {
            let mut s = broke_line(v, false);
            s.push_str("; the lock is free");
            s
        }
    };
    if b.stopped > 0 {
        let _ = write!(
            s,
            "; stopped {} process(es) of the old job first",
            b.stopped
        );
    }
    if let Some(u) = &b.unchecked {
        let _ = write!(s, "; not signalled: {}", scrub(u));
    }
    if let Some(t) = &b.at_terminal {
        s.push_str(&at_terminal_text(t, &l.holder.command));
    }
    s
}

/// `; the lock stays blocked until pid 4242 (alice, /dev/pts/3: bash -i) ends: …`, for a broken
/// script-mode lease whose script is a shell at a terminal, which leasehold never signals: who
/// must end, and how. An interactive shell ignores SIGTERM, so the advice is SIGHUP (what a
/// terminal's hang-up sends); `leasehold unlock` typed in it no longer helps (its keeper is gone
/// with the lease).
fn at_terminal_text(t: &AtTerminal, command: &[String]) -> String {
    format!(
        "; the lock stays blocked until pid {pid} ({}, {}: {}) ends: it holds the lock from a terminal, and leasehold never signals a shell at a terminal. End it there, or with `kill -HUP {pid}` (an interactive shell ignores a plain `kill`)",
        escape(&t.user),
        escape(&t.tty),
        text::quote_argv(command),
        pid = t.pid,
    )
}

/// `leasehold: fenced <cmd>: <reason>; lease on LOCK lost`. `cmd` is the shell-quoted command
/// ([`text::quote_argv`]).
pub fn fenced_line(cmd: &str, reason: &str, lock: &Path, survivors: usize) -> String {
    let mut s = format!(
        "leasehold: fenced {}: {}; lease on {} lost",
        scrub(cmd),
        scrub(reason),
        escape_path(lock)
    );
    if survivors > 0 {
        let _ = write!(
            s,
            " ({survivors} process(es) of its group still alive after SIGKILL)"
        );
    }
    s
}

/// `run --max-time` ran out: the command was fenced. `cmd` is the shell-quoted command.
pub fn timed_out_line(cmd: &str, limit: Duration, lock: &Path, survivors: usize) -> String {
    let mut s = format!(
        "leasehold: fenced {}: it ran for --max-time {} (lease on {}); exit 124",
        scrub(cmd),
        human_duration(limit),
        escape_path(lock)
    );
    if survivors > 0 {
        let _ = write!(
            s,
            " ({survivors} process(es) of its group still alive after SIGKILL)"
        );
    }
    s
}

/// `run --after-crash fail` refused: how the last holding ended, and the fix.
pub fn after_crash_line(lock: &Path, e: &LastEnding, acquired: &str) -> String {
    format!(
        "leasehold: not running the command: the last holding of {} {} (--after-crash fail); check what it left behind, then run `leasehold ack {}`",
        escape_path(lock),
        scrub(&e.describe(acquired)),
        escape_path(lock)
    )
}

/// `run --once-per` refused: when the last start was, and when the next is allowed.
pub fn once_per_line(lock: &Path, last: &str, period: Duration, next: &str) -> String {
    format!(
        "leasehold: not running the command: it last started under {} at {} (--once-per {}); the next start is allowed at {}",
        escape_path(lock),
        scrub(last),
        human_duration(period),
        scrub(next)
    )
}

/// `run --recover`'s command failed: the command is not run and the ending stays unclean.
pub fn recover_failed_line(lock: &Path, cmd: &str, code: i32) -> String {
    format!(
        "leasehold: the recovery command failed (exit {code}): not running the command; the last ending of {} stays unclean ({})",
        escape_path(lock),
        scrub(cmd)
    )
}

/// `leasehold ack` recorded (or found) an acknowledgement.
pub fn acked_line(lock: &Path, a: &leasehold::Acked) -> String {
    let what = if a.already {
        "was acknowledged already"
    } else {
        "acknowledged"
    };
    format!(
        "leasehold: {}: last ending {what}: {}",
        escape_path(lock),
        scrub(&a.ending.describe(&a.acquired_at))
    )
}

/// What a keeper writes on its script's terminal when the lease is lost: the script is not
/// signalled (it has a terminal), so the person at it must know its work is unprotected.
pub fn script_lost_line(lock: &Path, reason: &str, pid: i32) -> String {
    format!(
        "leasehold: the lease on {} was lost ({}): pid {pid} was not stopped because it has a terminal, and its work is no longer protected; the lock stays blocked until it ends",
        escape_path(lock),
        scrub(reason)
    )
}

/// `leasehold lock` refusing to hold a lease for a process it may not (another user's, pid 1,
/// a process that does not exist).
pub fn lock_target_refused(pid: i32, why: &str) -> String {
    format!(
        "leasehold: cannot hold a lock for pid {pid}: {}",
        scrub(why)
    )
}

/// `leasehold unlock` refused, or with nothing to do.
pub fn unlock_line(lock: &Path, what: &str) -> String {
    format!("leasehold: unlock {}: {}", escape_path(lock), scrub(what))
}

/// `leasehold: acquired LOCK (token N, lease id ID, TTL .., heartbeat .., grace ..)` (`-v`).
pub fn acquired_line(g: &leasehold::LeaseGuard) -> String {
    let t = g.timing();
    format!(
        "leasehold: acquired {} (token {}, lease id {}, TTL {}, heartbeat {}, grace {})",
        escape_path(g.path()),
        g.token(),
        g.lease_id(),
        human_duration(t.ttl),
        human_duration(t.heartbeat),
        human_duration(t.grace),
    )
}

/// The command ended but left processes in its group, stopped before releasing LOCK. `cmd` is
/// the shell-quoted command.
pub fn leftovers_line(cmd: &str, left: usize, lock: &Path) -> String {
    format!(
        "leasehold: {} ended but left {left} process(es) running in its process group; stopped them before releasing {}",
        scrub(cmd),
        escape_path(lock)
    )
}

/// The `leasehold run` wrapper (pid `wrapper`) died without ending its job (SIGKILL: a CI
/// cancel), and its guardian stopped what was left of the job: `stopped` processes carrying the
/// lease's environment, `killed` of them only by SIGKILL after the grace; `stuck` still alive.
pub fn guardian_line(
    lock: &Path,
    wrapper: i32,
    stopped: usize,
    killed: usize,
    stuck: Option<&str>,
) -> String {
    let mut s = format!(
        "leasehold: the wrapper holding {} (pid {wrapper}) is gone; its guardian stopped the command's {stopped} process(es) ({killed} by SIGKILL after the grace)",
        escape_path(lock)
    );
    if let Some(why) = stuck {
        let _ = write!(s, "; {}", scrub(why));
    }
    s
}

/// A release (or, `guardian`, the guardian of a wrapper that died) lets a program blocked on
/// the file LOCK named before our lease replaced it run first, and waits until it lets go
/// (PROTOCOL.md §4): said before the wait, which lasts as long as that program's job.
pub fn served_line(s: &leasehold::Served, guardian: bool) -> String {
    let who = if guardian {
        "the guardian of the wrapper that held"
    } else {
        "releasing"
    };
    if !s.blocked {
        return format!(
            "leasehold: {who} {} waits up to {} s for {} that has the file LOCK named before this lease replaced it open for writing (an NFS client's flock(1)?) to lock it or close it: if it locks it, it runs first, alone, while the lease still keeps every other job out",
            escape_path(&s.lock),
            leasehold::OPEN_TAKES_WITHIN.as_secs(),
            scrub(&s.who())
        );
    }
    format!(
        "leasehold: {who} {} waits for {} to finish first: it was blocked on the file LOCK named before this lease replaced it (util-linux flock(1)?), and runs now, alone, while the lease still keeps every other job out",
        escape_path(&s.lock),
        scrub(&s.who())
    )
}

/// The lease was lost just as the command ended. `cmd` is the shell-quoted command.
pub fn lost_at_end_line(lock: &Path, reason: &str, cmd: &str) -> String {
    format!(
        "leasehold: warning: the lease on {} was lost ({}) as {} ended",
        escape_path(lock),
        scrub(reason),
        scrub(cmd)
    )
}

/// `leasehold: released LOCK (how)` (`-v`).
pub fn released_line(lock: &Path, how: &str) -> String {
    format!("leasehold: released {} ({})", escape_path(lock), scrub(how))
}

/// The lines of clap's usage error as rendered with its styles (`styled`), shown plain and safe:
/// clap quotes the offending argument verbatim, so every argument of `argv` (and the value part
/// of `--flag=VALUE` and `-fVALUE`) that holds a control character is replaced by its escaped
/// form first — a newline inside an argument must not start a line of its own —, then clap's
/// own style sequences are dropped, and each line is scrubbed.
pub fn usage_error_lines(styled: &str, argv: &[std::ffi::OsString]) -> Vec<String> {
    let mut values: Vec<String> = Vec::new();
    for a in argv {
        let a = a.to_string_lossy();
        if scrub(&a) == a {
            continue;
        }
        if let Some((flag, v)) = a.split_once('=')
            && flag.starts_with('-')
        {
            values.push(v.to_string());
        }
        if !a.starts_with("--")
            && a.starts_with('-')
            && let Some(v) = a.get(2..)
        {
            values.push(v.to_string());
        }
        values.push(a.into_owned());
    }
    // Longest first, so that a whole argument is replaced before a part of it.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut msg = styled.to_string();
    for v in values.iter().filter(|v| !v.is_empty()) {
        msg = msg.replace(v.as_str(), &escape(v));
    }
    strip_csi(&msg)
        .trim_end_matches('\n')
        .split('\n')
        .map(|l| scrub(l).into_owned())
        .collect()
}

/// `s` without its CSI sequences (`ESC [` parameters, then one final byte in `@`..`~`): the
/// colours clap puts around parts of its messages.
fn strip_csi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for f in chars.by_ref() {
                if ('@'..='~').contains(&f) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The readable `status` block for one lock: one line per field, each value escaped on its own
/// (lease fields with [`text::escape`], the command shell-quoted, the verdict's reason with
/// [`text::scrub`]), so that no value can start a line of its own.
pub fn status_block(v: &Verdict) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}: {}", escape_path(&v.path), v.state);
    if let Some(m) = v.lease.as_ref().and_then(|l| l.mode) {
        holders_fields(&mut s, v, m);
        return s;
    }
    let Some(l) = &v.lease else {
        field(&mut s, "reason", &v.reason);
        return s;
    };
    if v.state == State::Free {
        free_fields(&mut s, v, l);
    } else {
        held_fields(&mut s, v, l);
    }
    if let Some(n) = &l.holder.note {
        field(&mut s, "note", &escape(n));
    }
    ending_fields(&mut s, v, l);
    queue_fields(&mut s, v);
    s
}

/// The lock's memory (`ending.rs`): a live holding's `--max-time` deadline, and how the last
/// holding ended (for a held lock, the one before the holder), with whether it awaits `ack`.
fn ending_fields(s: &mut String, v: &Verdict, l: &Lease) {
    if let (Some(d), false) = (&l.history.deadline, v.state == State::Free) {
        field(s, "deadline", &format!("{} (--max-time)", escape(d)));
    }
    if let Some(e) = leasehold::last_ending(l) {
        let mut line = e.describe(&l.acquired_at);
        if e.needs_attention() {
            line.push_str(" (not acknowledged: `leasehold ack`)");
        }
        field(s, "last ending", &line);
    }
}

/// The `status` fields of a shared or counted lock: its setting, then each holder as a block of
/// its own (LOCK's exclusive holder first, if any), then the queue.
fn holders_fields(s: &mut String, v: &Verdict, m: leasehold::Mode) {
    field(
        s,
        "mode",
        &format!("{} ({} holder(s))", m.setting(), v.holders.len()),
    );
    if v.state == State::Free {
        field(s, "reason", &v.reason);
    }
    let exclusive = v.lease.as_ref().filter(|l| l.state != LeaseState::Released);
    let all = exclusive.map(|l| (v, l)).into_iter().chain(
        v.holders
            .iter()
            .filter_map(|h| h.lease.as_ref().map(|l| (h, l))),
    );
    for (i, (h, l)) in all.enumerate() {
        let _ = writeln!(s, "  holder {}:", i + 1);
        let mut block = String::new();
        held_fields(&mut block, h, l);
        for line in block.lines() {
            let _ = writeln!(s, "  {line}");
        }
    }
    queue_fields(s, v);
}

/// One `  name:        value` line of the `status` block.
fn field(s: &mut String, name: &str, value: &str) {
    // `scrub` here is a second line of defence: every value given is escaped already.
    let _ = writeln!(s, "  {:<13}{}", format!("{name}:"), scrub(value));
}

/// `user@host pid N` of a lease's holder, escaped.
fn holder_text(l: &Lease) -> String {
    let h = &l.holder;
    if h.pid == 0 {
        // A stand-in for a holder without a record (an etcdctl lock holder): it says what it is.
        return h.describe();
    }
    if let (true, Some(c)) = (h.on_behalf, h.child_pid) {
        let (user, host) = (escape(&h.user), escape(&h.host));
        return format!("{user}@{host} script pid {c} (keeper pid {})", h.pid);
    }
    format!("{}@{} pid {}", escape(&h.user), escape(&h.host), h.pid)
}

/// The `status` fields of a free lock that keeps its last lease: who held it and how it ended.
fn free_fields(s: &mut String, v: &Verdict, l: &Lease) {
    let cmd = text::quote_argv(&l.holder.command);
    field(s, "last holder", &holder_text(l));
    if !cmd.is_empty() {
        field(s, "command", &cmd);
    }
    field(s, "token", &l.token.to_string());
    match &l.ended {
        Some(e) => {
            let by =
                e.by.as_ref()
                    .map(|b| format!(" by {}", escape(b)))
                    .unwrap_or_default();
            let (how, at) = (escape(&e.how), escape(&e.at));
            field(s, "ended", &format!("{how}{by} at {at}"));
        }
        None => field(s, "reason", &v.reason),
    }
}

/// The `status` fields of a lock with a lease in force (or stale): holder, child, command,
/// token, lease id, when acquired, the heartbeat, and the verdict's reason.
fn held_fields(s: &mut String, v: &Verdict, l: &Lease) {
    let h = &l.holder;
    let cmd = text::quote_argv(&h.command);
    let pg = h
        .pgid
        .map(|g| format!(", process group {g}"))
        .unwrap_or_default();
    match (h.on_behalf, h.child_pid) {
        // Script mode: the holder is the script; `pid` is the keeper renewing for it.
        (true, Some(c)) => {
            let who = format!("{}@{} pid {c}", escape(&h.user), escape(&h.host));
            field(s, "holder", &format!("{who} (script mode{pg})"));
            field(s, "keeper", &format!("pid {}", h.pid));
        }
        (_, c) => {
            field(s, "holder", &holder_text(l));
            if let Some(c) = c {
                field(s, "child", &format!("pid {c}{pg}"));
            }
        }
    }
    if !cmd.is_empty() {
        field(s, "command", &cmd);
    }
    field(s, "token", &l.token.to_string());
    field(s, "lease id", &escape(&l.lease_id));
    if let Some(t) = &v.server_lease {
        // An etcd lock: the cluster's own word on the owner's etcd lease stands in for a
        // heartbeat watched from this host.
        field(s, "heartbeat", &server_lease_text(t));
    }
    if h.pid == 0 {
        field(s, "reason", &v.reason);
        return;
    }
    let held = v
        .held_for()
        .map(|d| format!(" (held {})", human_duration(d)))
        .unwrap_or_default();
    field(s, "acquired", &format!("{}{held}", escape(&l.acquired_at)));
    if v.server_lease.is_some() {
        field(s, "reason", &v.reason);
        return;
    }
    // The age is this host's observation (how long it has seen the heartbeat unchanged); the
    // time written is the holder's clock: labelled so that the two never seem to disagree.
    let age = v
        .heartbeat_age
        .map(|a| format!("unchanged for {} as seen from this host", human_duration(a)))
        .unwrap_or_else(|| "not yet observed from this host".into());
    field(
        s,
        "heartbeat",
        &format!(
            "{age} (TTL {}, last written {} by the holder's clock)",
            human_duration(std::time::Duration::from_millis(l.ttl_ms)),
            escape(&l.heartbeat_at)
        ),
    );
    field(s, "reason", &v.reason);
}

/// What the cluster says of an etcd lock owner's etcd lease: `etcd lease 694d7d1f expires in
/// 4s without a keepalive (granted TTL 5s)`.
fn server_lease_text(t: &leasehold::ServerLease) -> String {
    if t.remaining_s < 0 {
        return format!(
            "etcd lease {:x} has expired or been revoked (granted TTL {}s)",
            t.lease, t.granted_s
        );
    }
    format!(
        "etcd lease {:x} expires in {}s without a keepalive (granted TTL {}s)",
        t.lease, t.remaining_s, t.granted_s
    )
}

/// The `waiting` count and one line per queued contender, if any wait.
fn queue_fields(s: &mut String, v: &Verdict) {
    if v.queue.is_empty() {
        return;
    }
    field(s, "waiting", &v.queue.len().to_string());
    for w in &v.queue {
        if w.pid == 0 {
            let _ = writeln!(s, "    {}", escape(&w.user));
            continue;
        }
        let _ = writeln!(
            s,
            "    {}@{} pid {} since {} ({})",
            escape(&w.user),
            escape(&w.host),
            w.pid,
            escape(&w.since),
            text::quote_argv(&w.command)
        );
    }
}
