//! The JSON `leasehold status --json` prints for a verdict (`run --json`'s events carry it too).
//!
//! Owns: the field names and shapes of that output (documented in the README and docs/json.md;
//! scripts parse it), and its text (pretty for `status`, one line for an event): besides the C0 controls JSON always escapes, every character that could move
//! or restyle a terminal's text (DEL, the C1 controls such as U+009B, the bidi controls, the
//! line and paragraph separators) is written as a `\uXXXX` escape, so the bytes printed are
//! safe on a terminal and parse to exactly the raw value.
//! Must never: change or shorten a value (JSON carries the raw ones), or read anything from disk.

use std::io;

use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};
use serde_json::{Value, json};

use leasehold::Verdict;

/// The machine-readable form of `v`, as `leasehold status --json` prints it.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("job.lock");
/// let g = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
/// let v = leasehold::status(&lock)?;
/// assert_eq!(leasehold_cli::cli::json::verdict(&v)["token"], g.token());
/// # Ok(()) }
/// ```
pub fn verdict(v: &Verdict) -> Value {
    let l = v.lease.as_ref();
    let h = l.map(|l| &l.holder);
    json!({
        "path": v.path.display().to_string(),
        "state": v.state,
        "reason": v.reason,
        "token": l.map(|l| l.token),
        "lease_id": l.map(|l| l.lease_id.clone()),
        "lease_state": l.map(|l| l.state),
        "pid": h.map(|h| h.pid),
        "child_pid": h.and_then(|h| h.child_pid),
        "script_pid": h.filter(|h| h.on_behalf).and_then(|h| h.child_pid),
        "keeper_pid": h.filter(|h| h.on_behalf).map(|h| h.pid),
        "pgid": h.and_then(|h| h.pgid),
        "host": h.map(|h| h.host.clone()),
        "user": h.map(|h| h.user.clone()),
        "command": h.map(|h| h.command.clone()),
        "note": h.and_then(|h| h.note.clone()),
        "acquired_at": l.map(|l| l.acquired_at.clone()),
        "heartbeat_at": l.map(|l| l.heartbeat_at.clone()),
        "heartbeat_seq": l.map(|l| l.heartbeat_seq),
        "heartbeat_age_ms": v.heartbeat_age.map(|a| a.as_millis() as u64),
        "ttl_ms": l.map(|l| l.ttl_ms),
        // An etcd lock's owner: its etcd lease as the cluster tells it (LeaseTimeToLive).
        "etcd_lease": v.server_lease.map(|t| json!({
            "id": format!("{:x}", t.lease), "ttl_remaining_s": t.remaining_s,
            "ttl_granted_s": t.granted_s,
        })),
        "same_host": v.same_host,
        "queue": v.queue.iter().map(|w| json!({
            "seq": w.seq, "pid": w.pid, "host": w.host, "user": w.user,
            "since": w.since, "command": w.command,
        })).collect::<Vec<_>>(),
        "ended": l.and_then(|l| l.ended.as_ref()).map(|e| json!({
            "at": e.at, "how": e.how, "by": e.by,
        })),
        // The lock's memory (`ending.rs`): this holding's --max-time deadline, the last start,
        // and how the last holding ended (for a held lock: the one before it).
        "deadline": l.and_then(|l| l.history.deadline.clone()),
        "last_start": l.and_then(|l| l.history.last_start.clone()),
        "last_ending": l.and_then(|l| leasehold::last_ending(l).map(|e| json!({
            "how": e.end.word(),
            "at": e.ended_at(&l.acquired_at),
            "host": e.host, "pid": e.pid, "token": e.token,
            "exit_status": e.status, "signal": e.signal,
            "detail": e.how, "by": e.by,
            "acked": e.acked.as_ref().map(|a| json!({"by": a.by, "at": a.at})),
            "needs_ack": e.needs_attention(),
        }))),
        // A shared or counted lock: its setting, and every holder of a holder file (LOCK's
        // own exclusive holder, if any, is the object itself).
        "mode": l.and_then(|l| l.mode).map(|m| json!({
            "shared": m.slots.is_none(), "slots": m.slots, "width": m.width,
        })),
        "holders": v.holders.iter().map(verdict).collect::<Vec<_>>(),
    })
}

/// `v` as pretty JSON text with every terminal-unsafe character escaped (see the module
/// comment).
///
/// ```
/// let v = serde_json::json!({"note": "a\u{9b}31mb\u{202e}c\u{2028}d"});
/// let t = leasehold_cli::cli::json::to_text(&v);
/// assert!(t.contains(r"a\u009b31mb\u202ec\u2028d"), "{t}");
/// assert_eq!(serde_json::from_str::<serde_json::Value>(&t).unwrap(), v);
/// ```
pub fn to_text(v: &Value) -> String {
    write_with(v, Safe(PrettyFormatter::new()))
}

/// `v` as JSON on one line (no newline in it: JSON escapes every control character inside a
/// string), with every terminal-unsafe character escaped as [`to_text`] does.
///
/// ```
/// let v = serde_json::json!({"event": "released", "how": "exited 0\n\u{9b}"});
/// let t = leasehold_cli::cli::json::to_line(&v);
/// assert!(!t.contains('\n') && t.contains(r"\u009b"), "{t}");
/// assert_eq!(serde_json::from_str::<serde_json::Value>(&t).unwrap(), v);
/// ```
pub fn to_line(v: &Value) -> String {
    write_with(v, Safe(CompactFormatter))
}

fn write_with<F: Formatter>(v: &Value, f: Safe<F>) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, f);
    match serde::Serialize::serialize(v, &mut ser) {
        Ok(()) => String::from_utf8(out).unwrap_or_else(|_| "null".into()),
        Err(_) => "null".into(),
    }
}

/// Whether `c` could move or restyle a terminal's text, so JSON text writes it as `\uXXXX`.
fn unsafe_on_terminal(c: char) -> bool {
    matches!(c,
        '\u{7f}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200e}' | '\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// A serde_json formatter (pretty or compact), escaping what [`unsafe_on_terminal`] names
/// inside strings.
struct Safe<F>(F);

impl<F: Formatter> Formatter for Safe<F> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some(i) = rest.find(unsafe_on_terminal) {
            w.write_all(&rest.as_bytes()[..i])?;
            let c = rest[i..].chars().next().unwrap_or(' ');
            write!(w, "\\u{:04x}", u32::from(c))?;
            rest = &rest[i + c.len_utf8()..];
        }
        w.write_all(rest.as_bytes())
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}
