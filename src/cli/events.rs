//! What `leasehold run` reports, as typed events, and the two ways of showing them.
//!
//! Owns: the [`Event`]s of a run (waiting, acquired, broke, refused, recovering, fenced,
//! timed-out, leftovers-stopped, lost, serving, released, error, not-started, usage-error), the choice of
//! renderer made once from the flags ([`for_run`]), the human renderer (today's lines from
//! `report`, the live wait line from `progress`, and what `-q`/`-v` hide or show) and the JSON
//! renderer (`--json`: one object a line on stderr, every event, the names and fields that
//! docs/json.md documents). Must never: decide anything about the run (exit statuses, whether
//! to stop: `run` and `ending` do), or write to stdout (it belongs to the command).
//!
//! The library prints nothing: it reports a wait through the builder's `on_wait` callback and a
//! break through `LeaseGuard::broke`; `run` turns both into events here.

use std::ffi::OsString;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use leasehold::text::quote_argv;
use leasehold::{Error, LastEnding, LeaseGuard, Verdict};
use serde_json::{Map, Value, json};

use super::args::RunArgs;
use super::progress::{self, WaitDisplay};
use super::{json, report};

/// One thing worth telling about a run, with what each renderer needs to tell it.
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// The lock is held: we wait (reported after every look at the lock).
    Waiting(&'a Verdict),
    /// The lease is ours.
    Acquired(&'a LeaseGuard),
    /// A stale or hung lease was broken to take the lock.
    Broke(&'a Verdict),
    /// The lock could not be had (`-n`, `-w` ran out, ...): `error` says why; `exit` is -E's.
    Refused {
        lock: &'a Path,
        error: &'a Error,
        exit: i32,
    },
    /// `--once-per`: the last start was too recent; the command is not run.
    TooSoon {
        lock: &'a Path,
        last: &'a str,
        period: Duration,
        next: &'a str,
        exit: i32,
    },
    /// `--after-crash fail`: the last holding ended uncleanly; the command is not run.
    AfterCrash {
        lock: &'a Path,
        ending: &'a LastEnding,
        acquired: &'a str,
        exit: i32,
    },
    /// `--recover`: the recovery command starts under the lease.
    Recovering { lock: &'a Path, command: &'a str },
    /// `--recover`'s command failed; the command is not run.
    RecoverFailed {
        lock: &'a Path,
        command: &'a str,
        exit: i32,
    },
    /// The lease was lost while the command ran: the command was fenced (exit 74).
    Fenced {
        lock: &'a Path,
        command: &'a [OsString],
        reason: &'a str,
        survivors: usize,
    },
    /// `--max-time` ran out: the command was fenced (exit 124).
    TimedOut {
        lock: &'a Path,
        command: &'a [OsString],
        limit: Duration,
        survivors: usize,
    },
    /// The command ended leaving processes in its group, stopped before the release.
    LeftoversStopped {
        lock: &'a Path,
        command: &'a [OsString],
        stopped: usize,
    },
    /// The lease was lost just as the command ended.
    Lost {
        lock: &'a Path,
        command: &'a [OsString],
        reason: &'a str,
    },
    /// The lease was released; `how` the job ended; `exit` is the run's status. `skipped`: the
    /// command never ran (`--once-per`, `--after-crash`, `--recover` refused it), which the
    /// human lines say by the refusal alone.
    Released {
        lock: &'a Path,
        how: &'a str,
        exit: i32,
        skipped: bool,
    },
    /// Something failed (`exit` is the status it maps to, when the run ends by it).
    Failed { lock: &'a Path, error: &'a Error },
    /// The release lets a program blocked on the file LOCK named before our lease replaced it
    /// run first, and waits until it lets go.
    Serving(&'a leasehold::Served),
    /// The command could not be started (`why` names it).
    NotStarted {
        lock: &'a Path,
        why: &'a str,
        exit: i32,
    },
    /// The command line cannot be honoured (`message` is the whole line).
    Usage { lock: &'a Path, message: &'a str },
}

impl Event<'_> {
    /// The event's name in JSON (docs/json.md).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Event::Waiting(_) => "waiting",
            Event::Acquired(_) => "acquired",
            Event::Broke(_) => "broke",
            Event::Refused { .. } | Event::TooSoon { .. } | Event::AfterCrash { .. } => "refused",
            Event::Recovering { .. } => "recovering",
            Event::RecoverFailed { .. } => "recover-failed",
            Event::Fenced { .. } => "fenced",
            Event::TimedOut { .. } => "timed-out",
            Event::LeftoversStopped { .. } => "leftovers-stopped",
            Event::Lost { .. } => "lost",
            Event::Released { .. } => "released",
            Event::Failed { .. } => "error",
            Event::Serving(_) => "serving",
            Event::NotStarted { .. } => "not-started",
            Event::Usage { .. } => "usage-error",
        }
    }

    /// The human line (escaped by `report`); `None` for `Waiting`, which the live wait line
    /// shows.
    fn line(&self) -> Option<String> {
        Some(match self {
            Event::Waiting(_) => return None,
            Event::Acquired(g) => report::acquired_line(g),
            Event::Broke(v) => report::broke_line(v, false),
            Event::Refused { error, .. } | Event::Failed { error, .. } => report::error_line(error),
            Event::TooSoon {
                lock,
                last,
                period,
                next,
                ..
            } => report::once_per_line(lock, last, *period, next),
            Event::AfterCrash {
                lock,
                ending,
                acquired,
                ..
            } => report::after_crash_line(lock, ending, acquired),
            Event::Recovering { command, .. } => format!(
                "leasehold: running the recovery command first (the last holding did not end cleanly): {}",
                quote_argv(&[command.to_string()])
            ),
            Event::RecoverFailed {
                lock,
                command,
                exit,
            } => report::recover_failed_line(lock, command, *exit),
            Event::Fenced {
                lock,
                command,
                reason,
                survivors,
            } => report::fenced_line(&quote_argv(command), reason, lock, *survivors),
            Event::TimedOut {
                lock,
                command,
                limit,
                survivors,
            } => report::timed_out_line(&quote_argv(command), *limit, lock, *survivors),
            Event::LeftoversStopped {
                lock,
                command,
                stopped,
            } => report::leftovers_line(&quote_argv(command), *stopped, lock),
            Event::Lost {
                lock,
                command,
                reason,
            } => report::lost_at_end_line(lock, reason, &quote_argv(command)),
            Event::Released { lock, how, .. } => report::released_line(lock, how),
            Event::Serving(s) => report::served_line(s, false),
            Event::NotStarted { why, .. } => report::not_started_line(why),
            Event::Usage { message, .. } => message.to_string(),
        })
    }

    /// The event's own JSON fields (besides `event`, `at` and `message`).
    fn fields(&self) -> Value {
        // LOCK as given made absolute (the library's paths are: the guard's, a verdict's); an
        // etcd:// or s3:// URL as given.
        let path = |p: &Path| {
            if leasehold::is_store_url(p) {
                return p.display().to_string();
            }
            std::path::absolute(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string()
        };
        let argv = |c: &[OsString]| -> Vec<String> {
            c.iter().map(|w| w.to_string_lossy().into_owned()).collect()
        };
        match self {
            Event::Waiting(v) => json!({
                "lock": path(&v.path), "state": v.state, "verdict": json::verdict(v),
            }),
            Event::Acquired(g) => {
                let t = g.timing();
                json!({
                    "lock": path(g.path()), "token": g.token(), "lease_id": g.lease_id(),
                    "ttl_ms": ms(t.ttl), "heartbeat_ms": ms(t.heartbeat), "grace_ms": ms(t.grace),
                })
            }
            Event::Broke(v) => json!({
                "lock": path(&v.path), "state": v.state,
                "token": v.lease.as_ref().map(|l| l.token),
                "pid": v.lease.as_ref().map(|l| l.holder.pid),
                "host": v.lease.as_ref().map(|l| l.holder.host.clone()),
                "reason": v.reason, "verdict": json::verdict(v),
            }),
            Event::Refused { lock, error, exit } => {
                let (because, verdict) = match error {
                    Error::WouldBlock { verdict, .. } => ("held", Some(&**verdict)),
                    Error::Timeout { verdict, .. } => ("wait-ran-out", Some(&**verdict)),
                    Error::MutexStuck { .. } => ("mutex-stuck", None),
                    _ => ("refused", None),
                };
                json!({
                    "lock": path(verdict.map_or(lock, |v| &v.path)), "because": because,
                    "exit": exit, "verdict": verdict.map(json::verdict),
                })
            }
            Event::TooSoon {
                lock,
                last,
                period,
                next,
                exit,
            } => json!({
                "lock": path(lock), "because": "once-per", "exit": exit,
                "last_start": last, "period_ms": ms(*period), "next_start": next,
            }),
            Event::AfterCrash {
                lock,
                ending,
                acquired,
                exit,
            } => json!({
                "lock": path(lock), "because": "after-crash", "exit": exit,
                "last_ending": ending.end.word(), "ended_at": ending.ended_at(acquired),
            }),
            Event::Recovering { lock, command } => json!({
                "lock": path(lock), "command": command,
            }),
            Event::RecoverFailed {
                lock,
                command,
                exit,
            } => json!({
                "lock": path(lock), "command": command, "exit": exit,
            }),
            Event::Fenced {
                lock,
                command,
                reason,
                survivors,
            } => json!({
                "lock": path(lock), "command": argv(command), "reason": reason,
                "survivors": survivors, "exit": super::exit::IOERR_FENCED,
            }),
            Event::TimedOut {
                lock,
                command,
                limit,
                survivors,
            } => json!({
                "lock": path(lock), "command": argv(command), "limit_ms": ms(*limit),
                "survivors": survivors, "exit": super::exit::TIMEOUT,
            }),
            Event::LeftoversStopped {
                lock,
                command,
                stopped,
            } => json!({
                "lock": path(lock), "command": argv(command), "stopped": stopped,
            }),
            Event::Lost {
                lock,
                command,
                reason,
            } => json!({
                "lock": path(lock), "command": argv(command), "reason": reason,
            }),
            Event::Released {
                lock,
                how,
                exit,
                skipped,
            } => json!({
                "lock": path(lock), "how": how, "exit": exit, "skipped": skipped,
            }),
            Event::Serving(s) => json!({
                "lock": path(&s.lock), "pid": s.pid, "user": s.user, "blocked": s.blocked,
            }),
            Event::Failed { lock, error } => json!({
                "lock": path(lock), "exit": super::exit::exit_code(error),
            }),
            Event::NotStarted { lock, exit, .. } => json!({
                "lock": path(lock), "exit": exit,
            }),
            Event::Usage { lock, .. } => json!({
                "lock": path(lock), "exit": super::exit::USAGE,
            }),
        }
    }
}

/// Milliseconds, as the JSON fields give durations.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Shows events; shared with the builder's `on_wait` callback (another thread).
pub(crate) trait Renderer: Send + Sync {
    /// Shows `e` (or not: the human renderer hides some under `-q` and shows some only with
    /// `-v`).
    fn emit(&self, e: &Event<'_>);
    /// The wait is over (the lock taken or given up): a live wait line is replaced by its last
    /// text.
    fn wait_over(&self) {}
}

/// The renderer `run`'s flags ask for: JSON with `--json`, else the human lines.
pub(crate) fn for_run(a: &RunArgs) -> Arc<dyn Renderer> {
    if a.json {
        Arc::new(JsonLines::default())
    } else {
        Arc::new(Human {
            quiet: a.quiet,
            verbose: a.verbose,
            wait: WaitDisplay::new(a.quiet),
        })
    }
}

/// Today's lines, as a person reads them.
struct Human {
    quiet: bool,
    verbose: bool,
    wait: WaitDisplay,
}

impl Renderer for Human {
    fn emit(&self, e: &Event<'_>) {
        let shown = match e {
            Event::Waiting(v) => {
                self.wait.waiting(v);
                return;
            }
            Event::Released { skipped: true, .. } => false,
            Event::Acquired(_) | Event::Released { .. } => self.verbose,
            Event::Broke(_)
            | Event::Refused { .. }
            | Event::TooSoon { .. }
            | Event::Recovering { .. }
            | Event::LeftoversStopped { .. }
            | Event::Serving(_) => !self.quiet,
            _ => true,
        };
        if let (true, Some(text)) = (shown, e.line()) {
            for line in text.lines() {
                say!("{line}");
            }
        }
    }

    fn wait_over(&self) {
        self.wait.done();
    }
}

/// `--json`: one object a line, every event.
#[derive(Default)]
struct JsonLines {
    /// What the last `waiting` event was about: another is written only when the holder, its
    /// state or what we wait behind changes (as the plain human line).
    waited: Mutex<Option<progress::Key>>,
}

impl Renderer for JsonLines {
    fn emit(&self, e: &Event<'_>) {
        if let Event::Waiting(v) = e {
            let key = progress::key(v);
            let mut waited = self.waited.lock().unwrap_or_else(PoisonError::into_inner);
            if waited.as_ref() == Some(&key) {
                return;
            }
            *waited = Some(key);
        }
        let mut obj = Map::new();
        obj.insert("event".into(), e.name().into());
        obj.insert(
            "at".into(),
            leasehold::format_rfc3339(SystemTime::now()).into(),
        );
        if let Value::Object(fields) = e.fields() {
            obj.extend(fields);
        }
        let message = match e {
            Event::Waiting(v) => report::blocking_line(v),
            _ => e.line().unwrap_or_default(),
        };
        obj.insert("message".into(), message.into());
        let mut line = json::to_line(&Value::Object(obj));
        line.push('\n');
        // One write per line, so that lines never interleave.
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}
