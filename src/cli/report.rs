//! What `leasehold` prints: every line and block a person reads, in one place.
//!
//! Owns: the wording of the contention line, break lines, the fencing line, error lines and the
//! readable `status` block. Must never: decide anything (exit statuses, whether to print at all
//! under `-q`): callers do; or print itself: it only formats.

use std::fmt::Write as _;

use crate::{Broken, Error, Frees, LeaseState, State, Verdict, human_duration};

/// `leasehold: <error>`.
pub fn error_line(e: &Error) -> String {
    format!("leasehold: {e}")
}

/// The cargo-style contention line:
/// `Blocking waiting for lock /srv/deploy.lock held by alice@web1 pid 4242 (terraform apply), heartbeat 3s ago, held 12m, token 17`.
pub fn blocking_line(v: &Verdict) -> String {
    format!("Blocking waiting for lock {} {v}", v.path.display())
}

/// One line for a lease broken to take the lock, or by `leasehold break`:
/// `broke stale lease of pid 4242 on web1: process gone (token 17)`.
pub fn broke_line(v: &Verdict, was_live: bool) -> String {
    let Some(l) = &v.lease else {
        return format!(
            "leasehold: {}: nothing to break ({})",
            v.path.display(),
            v.reason
        );
    };
    let h = &l.holder;
    let mut s = format!(
        "leasehold: broke {} lease of pid {} on {}: {} (token {})",
        v.state, h.pid, h.host, v.reason, l.token
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
            "leasehold: {forged} (forged or copied lease): replaced it without signalling anything (token {}); the lock is free",
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
                h.host,
                l.token,
                v.reason
            );
            let _ = write!(
                s,
                "; it will fence its command at its next renewal (last heartbeat written {})",
                l.heartbeat_at
            );
            match b.frees {
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
        let _ = write!(s, "; not signalled: {u}");
    }
    s
}

/// `leasehold: fenced <cmd>: <reason>; lease on LOCK lost`.
pub fn fenced_line(cmd: &str, reason: &str, lock: &std::path::Path, survivors: usize) -> String {
    let mut s = format!(
        "leasehold: fenced {cmd}: {reason}; lease on {} lost",
        lock.display()
    );
    if survivors > 0 {
        let _ = write!(
            s,
            " ({survivors} process(es) of its group still alive after SIGKILL)"
        );
    }
    s
}

/// The readable `status` block for one lock.
pub fn status_block(v: &Verdict) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}: {}", v.path.display(), v.state);
    let field = |s: &mut String, name: &str, value: &str| {
        let _ = writeln!(s, "  {:<13}{value}", format!("{name}:"));
    };
    let Some(l) = &v.lease else {
        field(&mut s, "reason", &v.reason);
        return s;
    };
    let h = &l.holder;
    let cmd = h.command.join(" ");
    let who = format!("{}@{} pid {}", h.user, h.host, h.pid);
    if v.state == State::Free {
        field(&mut s, "last holder", &who);
        if !cmd.is_empty() {
            field(&mut s, "command", &cmd);
        }
        field(&mut s, "token", &l.token.to_string());
        match &l.ended {
            Some(e) => {
                let by =
                    e.by.as_ref()
                        .map(|b| format!(" by {b}"))
                        .unwrap_or_default();
                field(&mut s, "ended", &format!("{}{by} at {}", e.how, e.at));
            }
            None => field(&mut s, "reason", &v.reason),
        }
    } else {
        field(&mut s, "holder", &who);
        if let Some(c) = h.child_pid {
            let pg = h
                .pgid
                .map(|g| format!(", process group {g}"))
                .unwrap_or_default();
            field(&mut s, "child", &format!("pid {c}{pg}"));
        }
        if !cmd.is_empty() {
            field(&mut s, "command", &cmd);
        }
        field(&mut s, "token", &l.token.to_string());
        field(&mut s, "lease id", &l.lease_id);
        let held = v
            .held_for()
            .map(|d| format!(" (held {})", human_duration(d)))
            .unwrap_or_default();
        field(&mut s, "acquired", &format!("{}{held}", l.acquired_at));
        let age = v
            .heartbeat_age
            .map(|a| format!("{} ago", human_duration(a)))
            .unwrap_or_else(|| "unknown".into());
        field(
            &mut s,
            "heartbeat",
            &format!(
                "{age} (TTL {}, last written {})",
                human_duration(std::time::Duration::from_millis(l.ttl_ms)),
                l.heartbeat_at
            ),
        );
        field(&mut s, "reason", &v.reason);
    }
    if let Some(n) = &h.note {
        field(&mut s, "note", n);
    }
    if !v.queue.is_empty() {
        field(&mut s, "waiting", &v.queue.len().to_string());
        for w in &v.queue {
            let _ = writeln!(
                s,
                "    {}@{} pid {} since {} ({})",
                w.user,
                w.host,
                w.pid,
                w.since,
                w.command.join(" ")
            );
        }
    }
    s
}
