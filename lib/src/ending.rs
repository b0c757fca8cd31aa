//! How the last holding of a lock ended, remembered in the lock itself.
//!
//! Owns: the [`History`] a lease record carries forward from holding to holding (the previous
//! holding's [`LastEnding`], the last time a command started, this holding's `--max-time`
//! deadline, an operator's acknowledgement), the one rule that classifies an ended record as
//! `released`, `fenced`, `died` or `broken`, and `ack` (recording that an operator looked at an
//! unclean ending). Must never: decide anything about who may hold the lock (it is policy on
//! top of the lease, never part of the safety argument), write a lease that is not released
//! (a live holder's record is only ever replaced by a takeover), or panic on any record.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, SystemClock, format_rfc3339, parse_rfc3339};
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::record::{Lease, LeaseState};

/// The `how` prefix of a release whose command was never started on purpose (refused by
/// `--after-crash fail` or `--once-per`, or a failed `--recover`): such a holding is not an
/// ending of its own; the ending before it stays the last one.
pub const SKIPPED: &str = "skipped: ";

/// How a holding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndKind {
    /// The job ended by itself (exit status or signal) and the holder released the lease.
    Released,
    /// The holder fenced its job: the lease was lost, or `--max-time` ran out.
    Fenced,
    /// The holder was taken over: proved dead on its host, or its heartbeat lapsed.
    Died,
    /// An operator broke or revoked the lease (`break`).
    Broken,
}

impl EndKind {
    /// The word `LEASEHOLD_PREVIOUS` carries: `released`, `fenced`, `died`, `broken`.
    pub fn word(self) -> &'static str {
        match self {
            EndKind::Released => "released",
            EndKind::Fenced => "fenced",
            EndKind::Died => "died",
            EndKind::Broken => "broken",
        }
    }

    /// Whether the next run should distrust what the job left behind (`--after-crash`,
    /// `--recover`): fenced, died or broken.
    pub fn unclean(self) -> bool {
        self != EndKind::Released
    }
}

/// An operator's acknowledgement of an unclean ending (`leasehold ack`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Who: `user@host pid N`.
    pub by: String,
    /// When (their wall clock, RFC 3339).
    pub at: String,
}

/// How the holding before this one ended (a new holder's record carries it as `last`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastEnding {
    /// Released, fenced, died or broken.
    pub end: EndKind,
    /// When it ended (RFC 3339), if the record said; otherwise the next holding's acquisition
    /// time is the best known (see [`LastEnding::ended_at`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// The ended holding's host.
    pub host: String,
    /// Its holder's pid.
    pub pid: i32,
    /// Its fencing token.
    pub token: u64,
    /// The command's exit status, when it was released after exiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    /// The signal that ended the command, when it was released after one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The words the record gave (`exit 3`, `fenced: …`, `broken: …`, the takeover's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
    /// Who broke or revoked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// An operator's acknowledgement (`leasehold ack`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked: Option<Ack>,
}

impl LastEnding {
    /// When it ended, or (not recorded: a hand-over or a takeover) `fallback`, the time the
    /// next holder found it ended.
    pub fn ended_at<'a>(&'a self, fallback: &'a str) -> &'a str {
        self.at.as_deref().unwrap_or(fallback)
    }

    /// The exit status `LEASEHOLD_PREVIOUS_STATUS` gives: the exit status, or 128+N for
    /// signal N (as a shell's `$?`); `None` when not released or not known.
    pub fn exit_status(&self) -> Option<i32> {
        if self.end != EndKind::Released {
            return None;
        }
        self.status.or(self.signal.map(|s| 128 + s))
    }

    /// Unclean and not acknowledged: what `--after-crash fail` refuses and `--recover` acts on.
    pub fn needs_attention(&self) -> bool {
        self.end.unclean() && self.acked.is_none()
    }

    /// One line for people: `died at …: host web1 pid 42 token 7, …`.
    pub fn describe(&self, fallback_at: &str) -> String {
        let mut s = self.end.word().to_string();
        if let Some(st) = self.status {
            s.push_str(&format!(" (exit {st})"));
        } else if let Some(sig) = self.signal {
            s.push_str(&format!(" (signal {sig})"));
        }
        s.push_str(&format!(
            " at {}: host {} pid {} token {}",
            self.ended_at(fallback_at),
            crate::text::escape(&self.host),
            self.pid,
            self.token
        ));
        if let Some(h) = &self.how {
            s.push_str(&format!(", {}", crate::text::escape(h)));
        }
        if let Some(b) = &self.by {
            s.push_str(&format!(", by {}", crate::text::escape(b)));
        }
        if let Some(a) = &self.acked {
            s.push_str(&format!(
                "; acknowledged by {} at {}",
                crate::text::escape(&a.by),
                a.at
            ));
        }
        s
    }
}

/// What a lease record remembers beyond its own holding (all optional: a format-1 record
/// without them reads as an empty history).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// How the holding before this one ended (`last`).
    pub last: Option<LastEnding>,
    /// When a command last started under this lock before this holding (`last_start`,
    /// RFC 3339): what `--once-per` measures from.
    pub last_start: Option<String>,
    /// This holding's `--max-time` deadline (`deadline`, RFC 3339), shown by `status`.
    pub deadline: Option<String>,
    /// In a released record: an operator's acknowledgement of its ending (`acked`).
    pub acked: Option<Ack>,
}

/// Whether a released record's holding never started its command on purpose.
fn skipped(l: &Lease) -> bool {
    l.ended.as_ref().is_some_and(|e| e.how.starts_with(SKIPPED))
}

/// The leading integer of `s` (`3` of `3`, `9` of `9 (SIGKILL)`).
fn leading_int(s: &str) -> Option<i32> {
    let n: String = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    n.parse().ok()
}

/// The last ending a record shows: a released record's own (or, when its holding was
/// skipped, the one it carried forward), a held or revoked record's `last` (its holding has
/// not ended). `None`: no ending is known (a lock never held, or emptied).
pub fn last_ending(l: &Lease) -> Option<LastEnding> {
    if l.state != LeaseState::Released {
        return l.history.last.clone();
    }
    let mut out = if skipped(l) {
        l.history.last.clone()?
    } else {
        own_ending(l)
    };
    if let Some(a) = &l.history.acked {
        out.acked = Some(a.clone());
    }
    Some(out)
}

/// A released record's own ending.
fn own_ending(l: &Lease) -> LastEnding {
    let mut out = LastEnding {
        end: EndKind::Released,
        at: None,
        host: l.holder.host.clone(),
        pid: l.holder.pid,
        token: l.token,
        status: None,
        signal: None,
        how: None,
        by: None,
        acked: None,
    };
    let Some(e) = &l.ended else {
        // Released in place (a hand-over to a waiter, used only after `exit 0` of a named
        // command or a library release) or in its header only (a full disk): no words.
        out.status = (l.holder.child_pid.is_some() && !l.holder.on_behalf).then_some(0);
        return out;
    };
    out.at = Some(e.at.clone());
    out.how = Some(e.how.clone());
    out.by = e.by.clone();
    let how = e.how.as_str();
    out.end = if e.by.is_some() || how.starts_with("broken") || how.starts_with("revoked") {
        EndKind::Broken
    } else if how.starts_with("fenced") {
        EndKind::Fenced
    } else if how.starts_with("died") {
        // Never written by a holder: what `status` of an etcd lock shows of a holding whose
        // key is gone before it recorded its end (`store/etcd/ending.rs`).
        EndKind::Died
    } else {
        EndKind::Released
    };
    if let Some(rest) = how.strip_prefix("exit ") {
        out.status = leading_int(rest);
    } else if let Some(rest) = how.strip_prefix("signal ") {
        out.signal = leading_int(rest);
    }
    out
}

/// The ending a new holder records as `last` when it takes the lease over `prev` (what LOCK
/// held, `None` when missing or empty): a released record's ending, or — a held or revoked
/// record taken over as stale or hung — `died`, or `broken` when it had been revoked.
pub(crate) fn after(prev: Option<&Lease>, reason: Option<&str>) -> Option<LastEnding> {
    let r = prev?;
    if r.state == LeaseState::Released {
        return last_ending(r);
    }
    let by = r.ended.as_ref().and_then(|e| e.by.clone());
    let end = if r.state == LeaseState::Revoked || by.is_some() {
        EndKind::Broken
    } else {
        EndKind::Died
    };
    Some(LastEnding {
        end,
        at: None,
        host: r.holder.host.clone(),
        pid: r.holder.pid,
        token: r.token,
        status: None,
        signal: None,
        how: reason
            .map(str::to_string)
            .or_else(|| r.ended.as_ref().map(|e| e.how.clone())),
        by,
        acked: None,
    })
}

/// When a command last started under the lock, as record `r` shows: its own acquisition,
/// unless its holding was skipped (then what it carried forward).
pub(crate) fn latest_start(r: &Lease) -> Option<String> {
    if r.state == LeaseState::Released && skipped(r) {
        r.history.last_start.clone()
    } else {
        Some(r.acquired_at.clone())
    }
}

/// The history a new holder's record carries, taking over `prev` (judged `reason` when taken
/// over as stale or hung); its deadline is set apart ([`deadline`]).
pub(crate) fn carried(prev: Option<&Lease>, reason: Option<&str>) -> History {
    History {
        last: after(prev, reason),
        last_start: prev.and_then(latest_start),
        deadline: None,
        acked: None,
    }
}

/// The `--max-time` deadline of a holding acquired at `acquired` (RFC 3339).
pub(crate) fn deadline(acquired: &str, max_time: Option<Duration>) -> Option<String> {
    Some(format_rfc3339(parse_rfc3339(acquired)? + max_time?))
}

/// The history a waiter drafts its record with while `current` holds the lock: the one a
/// hand-over from it (released in place after a clean end) would carry, so that the common
/// hand-over uses the record prepared while waiting. Any other ending just serialises anew.
pub(crate) fn speculate(current: Option<&Lease>) -> History {
    let Some(c) = current.filter(|c| c.state == LeaseState::Held) else {
        return History::default();
    };
    let mut handed = c.clone();
    handed.state = LeaseState::Released;
    handed.ended = None;
    carried(Some(&handed), None)
}

/// Whether a release `how` may go in place, leaving a record that says nothing of how it ended
/// (a hand-over to a waiter): only `exit 0` of a named command, a script's end in script mode
/// (whose status its keeper never knows), or a library release of a lease that names no
/// command — what [`last_ending`] reads from such a record.
pub(crate) fn clean_handover(how: &str, mine: &Lease) -> bool {
    match (mine.holder.child_pid, mine.holder.on_behalf) {
        // Script mode: the keeper never learns its script's status.
        (Some(_), true) => how.starts_with("script pid ") && how.ends_with(" exited"),
        (Some(_), false) => how == "exit 0",
        (None, _) => how.starts_with("released"),
    }
}

/// When the next start is allowed under `--once-per period`, if a start now (`now`) is too
/// soon after the last start `last_start` (RFC 3339, another host's wall clock: see
/// PROTOCOL.md §16).
pub fn too_soon(
    last_start: Option<&str>,
    period: Duration,
    now: std::time::SystemTime,
) -> Option<std::time::SystemTime> {
    let last = parse_rfc3339(last_start?)?;
    let next = last + period;
    (now < next).then_some(next)
}

/// What `leasehold ack` did.
#[derive(Debug, Clone)]
pub struct Acked {
    /// The ending acknowledged.
    pub ending: LastEnding,
    /// When LOCK's record was written (the fallback time for the ending).
    pub acquired_at: String,
    /// It had been acknowledged already (nothing written).
    pub already: bool,
}

/// Records an operator's acknowledgement of LOCK's last ending (`leasehold ack`): under the
/// lock's mutex, a released record is rewritten with `acked` (who, when); on an etcd lock, its
/// history (`store/etcd/ending.rs`). Refused when the lock is held (its holder already started
/// after that ending), when no ending is recorded, or when the last ending was clean.
pub fn ack(path: impl AsRef<Path>) -> Result<Acked> {
    let path = path.as_ref();
    let me = Identity::current();
    let by = format!("{}@{} pid {}", me.user, me.host, std::process::id());
    if let Some(r) = crate::store::ack_elsewhere(path, &by) {
        return r;
    }
    crate::status::ack_under_mutex(path, &mut |lease: &Lease| ack_record(path, lease, &by))
}

/// What `ack` by `by` does to the record `lease` that holds LOCK's last ending: the record to
/// write (`None`: acknowledged already) and what to say, or why not.
pub(crate) fn ack_record(path: &Path, lease: &Lease, by: &str) -> Result<(Option<Lease>, Acked)> {
    let refuse = |why: String| Error::Refused {
        path: path.to_path_buf(),
        why,
    };
    if lease.damaged {
        // Judged by observation alone (PROTOCOL §2): never rewritten as if it were read.
        return Err(refuse(
            "LOCK's record is damaged (its checksum never matched): nothing acknowledged".into(),
        ));
    }
    if lease.state != LeaseState::Released {
        return Err(refuse(
            "the lock is held or its holder's end is not recorded yet: acknowledge once it is released (a dead holder's lease is recorded when the next run or `leasehold break` takes it)".into(),
        ));
    }
    let Some(ending) = last_ending(lease) else {
        return Err(refuse("no ending is recorded in this lock".into()));
    };
    if !ending.end.unclean() {
        return Err(refuse(format!(
            "the last ending was clean ({}): nothing to acknowledge",
            ending.describe(&lease.acquired_at)
        )));
    }
    let out = Acked {
        ending: ending.clone(),
        acquired_at: lease.acquired_at.clone(),
        already: ending.acked.is_some(),
    };
    if out.already {
        return Ok((None, out));
    }
    let mut rec = lease.clone();
    rec.history.acked = Some(Ack {
        by: by.to_string(),
        at: format_rfc3339(SystemClock.wall()),
    });
    let mut shown = out;
    shown.ending.acked = rec.history.acked.clone();
    Ok((Some(rec), shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_measures_from_the_last_start() {
        let t0 = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = format_rfc3339(t0);
        let h = Duration::from_secs(3600);
        assert!(too_soon(Some(&s), h, t0 + Duration::from_secs(10)).is_some());
        assert!(too_soon(Some(&s), h, t0 + h).is_none());
        assert!(too_soon(None, h, t0).is_none());
    }

    fn record(state: LeaseState, how: Option<&str>, by: Option<&str>) -> Lease {
        Lease {
            state,
            heartbeat_seq: 0,
            heartbeat_at: "2026-01-01T00:00:00.000000Z".into(),
            lease_id: "0".repeat(32),
            token: 7,
            ttl_ms: 1000,
            acquired_at: "2026-01-01T00:00:00.000000Z".into(),
            holder: crate::record::Holder {
                pid: 42,
                pid_start: 1,
                child_pid: Some(43),
                child_start: Some(2),
                pgid: Some(43),
                host: "web1".into(),
                boot_id: "b".into(),
                pid_ns: 1,
                uid: 0,
                user: "u".into(),
                command: vec![],
                note: None,
                on_behalf: false,
            },
            ended: how.map(|h| crate::record::Ending {
                at: "2026-01-01T00:00:01.000000Z".into(),
                how: h.into(),
                by: by.map(String::from),
            }),
            mode: None,
            history: History::default(),
            damaged: false,
        }
    }

    #[test]
    fn endings_are_classified_from_format_1_fields() {
        use LeaseState::*;
        let end = |l: Lease| last_ending(&l).map(|e| (e.end, e.exit_status()));
        let released = Some((EndKind::Released, Some(3)));
        assert_eq!(end(record(Released, Some("exit 3"), None)), released);
        let signal = Some((EndKind::Released, Some(137)));
        assert_eq!(
            end(record(Released, Some("signal 9 (SIGKILL)"), None)),
            signal
        );
        // Released in place: only after exit 0 of a named command.
        assert_eq!(
            end(record(Released, None, None)),
            Some((EndKind::Released, Some(0)))
        );
        let fenced = Some((EndKind::Fenced, None));
        assert_eq!(
            end(record(Released, Some("fenced: lease lost"), None)),
            fenced
        );
        let broken = Some((EndKind::Broken, None));
        assert_eq!(
            end(record(
                Released,
                Some("broken: process gone"),
                Some("a@b pid 1")
            )),
            broken
        );
        let revoked = record(
            Released,
            Some("fenced: x, after it was revoked"),
            Some("a@b pid 1"),
        );
        assert_eq!(end(revoked), broken);
        // A held record has not ended: it shows the ending before it.
        assert_eq!(end(record(Held, None, None)), None);
        // Taken over: died, or broken when it had been revoked.
        let died = after(Some(&record(Held, None, None)), Some("process gone"));
        assert_eq!(died.map(|e| e.end), Some(EndKind::Died));
        let rev = record(Revoked, Some("revoked by force: x"), Some("a@b pid 1"));
        assert_eq!(
            after(Some(&rev), None).map(|e| e.end),
            Some(EndKind::Broken)
        );
        assert_eq!(after(None, None), None);
    }

    #[test]
    fn a_skipped_holding_keeps_the_ending_and_the_start_before_it() {
        let mut first = record(LeaseState::Released, Some("fenced: x"), None);
        first.acquired_at = "2026-01-01T00:00:00.000000Z".into();
        let mut skipped = record(
            LeaseState::Released,
            Some("skipped: --after-crash fail"),
            None,
        );
        skipped.history = carried(Some(&first), None);
        skipped.acquired_at = "2026-01-01T05:00:00.000000Z".into();
        let e = last_ending(&skipped).expect("an ending");
        assert_eq!(
            (e.end, e.how.as_deref()),
            (EndKind::Fenced, Some("fenced: x"))
        );
        assert_eq!(latest_start(&skipped), Some(first.acquired_at.clone()));
        // An in-place release is used only where that is what a reader infers.
        assert!(clean_handover("exit 0", &first));
        assert!(!clean_handover("exit 3", &first));
        assert!(!clean_handover("skipped: x", &first));
    }

    #[test]
    fn history_round_trips_and_a_record_without_it_reads_as_none() {
        use crate::record::Parsed;
        let plain = record(LeaseState::Held, None, None);
        let bytes = plain.to_bytes();
        assert!(!String::from_utf8_lossy(&bytes).contains("\"last"));
        let Parsed::Lease(back) = Lease::parse(&bytes) else {
            panic!("not parsed")
        };
        assert_eq!(back.history, History::default());
        let mut with = plain.clone();
        with.history = carried(
            Some(&record(LeaseState::Released, Some("exit 3"), None)),
            None,
        );
        with.history.deadline = deadline(&with.acquired_at, Some(Duration::from_secs(60)));
        let bytes = with.to_bytes();
        assert!(
            bytes.starts_with(b"{\n  \"leasehold\": 1,"),
            "format 1 kept"
        );
        let Parsed::Lease(back) = Lease::parse(&bytes) else {
            panic!("not parsed")
        };
        assert_eq!(back.history, with.history);
        assert_eq!(
            back.history.deadline.as_deref(),
            Some("2026-01-01T00:01:00.000000Z")
        );
    }

    #[test]
    fn leading_integers_parse() {
        assert_eq!(leading_int("3"), Some(3));
        assert_eq!(leading_int("9 (SIGKILL)"), Some(9));
        assert_eq!(leading_int("x"), None);
    }
}
