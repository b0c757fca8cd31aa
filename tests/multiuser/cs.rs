//! The O_EXCL critical-section checker shared by jobs of different users.
//!
//! Each job is `sh DIR/job.sh DIR ID TICKS PERIOD`. On entering it creates `DIR/inside` with
//! O_EXCL (`set -C`) holding its id, pid and start time. If that fails, the one inside must be a
//! job the test declared killed (`DIR/killed-ID`, written before the SIGKILL) whose shell is
//! verifiably dead (gone, a zombie, or its pid reused); the newcomer then replaces the leftover.
//! Anything else is a violation, recorded in `DIR/violation-ID`. It then writes `DIR/entered-ID`
//! (the marker that says a kill lands inside the section), logs `start`, a `tick` every PERIOD
//! seconds for TICKS ticks (or until `DIR/release-ID` exists), `end`, and removes `inside`.
//! Every log line carries CLOCK_REALTIME in ns; [`Cs::verify`] checks that no two jobs' intervals
//! (start .. last line) intersect. Each job writes only files of its own, so jobs of users with
//! any umask can share the directory (mode 0777, not sticky).
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::harness::{chmod, wait_until};

const SCRIPT: &str = r#"cs=$1 id=$2 ticks=$3 period=$4
dead() {
  want=$2
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  [ -n "$s" ] || return 0
  set -- $s
  [ "$3" = Z ] || [ "$3" = X ] || [ "${22}" != "$want" ]
}
set -- $(cat /proc/$$/stat)
me="$id $$ ${22}"
if ! (set -C; printf '%s\n' "$me" > "$cs/inside") 2>/dev/null; then
  oid= opid= ost=
  read -r oid opid ost < "$cs/inside" 2>/dev/null
  if [ -n "$oid" ] && [ -e "$cs/killed-$oid" ] && dead "$opid" "$ost"; then
    printf '%s\n' "$me" > "$cs/inside.$id" && mv -f "$cs/inside.$id" "$cs/inside"
  else
    printf '%s entered while %s (pid %s) was inside\n' "$id" "${oid:-?}" "${opid:-?}" > "$cs/violation-$id"
  fi
fi
echo "start $(date +%s%N)" > "$cs/job-$id"
if [ "$ticks" = 0 ]; then
  # Held until the test writes to the FIFO: no child process meanwhile.
  exec 3<>"$cs/fifo-$id"
  printf '%s\n' "$me" > "$cs/entered-$id"
  read -r x <&3
  ticks=0
fi
[ -e "$cs/entered-$id" ] || printf '%s\n' "$me" > "$cs/entered-$id"
i=0
while [ "$i" -lt "$ticks" ] && [ ! -e "$cs/release-$id" ]; do
  sleep "$period"
  i=$((i+1))
  echo "tick $(date +%s%N)" >> "$cs/job-$id"
done
echo "end $(date +%s%N)" >> "$cs/job-$id"
oid=
read -r oid rest < "$cs/inside" 2>/dev/null
[ "$oid" = "$id" ] && rm -f "$cs/inside"
exit 0
"#;

pub struct Cs {
    pub dir: PathBuf,
}

/// One job's log: start, last line, and whether it ended by itself.
#[derive(Debug, Clone)]
pub struct Interval {
    pub id: String,
    pub start: u128,
    pub last: u128,
    pub ended: bool,
}

impl Cs {
    /// A fresh checker directory `name` under `base` (mode 0777, owned by root).
    pub fn new(base: &Path, name: &str) -> Cs {
        let dir = base.join(name);
        fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o777);
        fs::write(dir.join("job.sh"), SCRIPT).unwrap();
        chmod(&dir.join("job.sh"), 0o755);
        Cs { dir }
    }

    /// The command line of job `id`: TICKS ticks of PERIOD seconds (`release` ends it early).
    pub fn job(&self, id: &str, ticks: u32, period: &str) -> Vec<String> {
        vec![
            "sh".into(),
            self.dir.join("job.sh").to_str().unwrap().into(),
            self.dir.to_str().unwrap().into(),
            id.into(),
            ticks.to_string(),
            period.into(),
        ]
    }

    /// `leasehold` arguments: `pre` followed by `LOCK -- job`.
    pub fn run_args(&self, pre: &[&str], lock: &Path, id: &str, ticks: u32) -> Vec<String> {
        let mut v: Vec<String> = vec!["run".into()];
        v.extend(pre.iter().map(|s| s.to_string()));
        v.push(lock.to_str().unwrap().into());
        v.push("--".into());
        v.extend(self.job(id, ticks, "0.02"));
        v
    }

    /// A job that blocks (in the shell itself, no child process) until [`Cs::release`].
    pub fn hold_args(&self, pre: &[&str], lock: &Path, id: &str) -> Vec<String> {
        let fifo = self.dir.join(format!("fifo-{id}"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        chmod(&fifo, 0o666);
        let mut v: Vec<String> = vec!["run".into()];
        v.extend(pre.iter().map(|s| s.to_string()));
        v.push(lock.to_str().unwrap().into());
        v.push("--".into());
        v.extend(self.job(id, 0, "0"));
        v
    }

    pub fn entered(&self, id: &str) -> bool {
        self.dir.join(format!("entered-{id}")).exists()
    }

    /// The pid of job `id`'s shell, once it has entered.
    pub fn job_pid(&self, id: &str) -> Option<i32> {
        fs::read_to_string(self.dir.join(format!("entered-{id}")))
            .ok()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    #[track_caller]
    pub fn wait_entered(&self, id: &str, limit: Duration) {
        assert!(
            wait_until(limit, || self.entered(id)),
            "job {id} did not enter its critical section within {limit:?}"
        );
    }

    /// Number of ticks job `id` has logged so far.
    pub fn ticks(&self, id: &str) -> usize {
        fs::read_to_string(self.dir.join(format!("job-{id}")))
            .map(|s| s.lines().filter(|l| l.starts_with("tick")).count())
            .unwrap_or(0)
    }

    pub fn ended(&self, id: &str) -> bool {
        fs::read_to_string(self.dir.join(format!("job-{id}")))
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("end")))
    }

    /// Declares job `id` about to be killed: its leftover `inside` may be replaced once its
    /// shell is dead.
    pub fn declare_killed(&self, id: &str) {
        fs::write(self.dir.join(format!("killed-{id}")), "").unwrap();
    }

    /// Lets a held job finish (its FIFO has a reader once it has entered).
    pub fn release(&self, id: &str) {
        fs::write(self.dir.join(format!("release-{id}")), "").unwrap();
        let fifo = self.dir.join(format!("fifo-{id}"));
        if let Ok(mut f) = fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&fifo)
        {
            let _ = f.write_all(b"go\n");
        }
    }

    /// Every job's interval, sorted by start.
    pub fn intervals(&self) -> Vec<Interval> {
        let mut v = Vec::new();
        for e in fs::read_dir(&self.dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_prefix("job-") else {
                continue;
            };
            let text = fs::read_to_string(e.path()).unwrap_or_default();
            let mut start = None;
            let mut last = 0u128;
            let mut ended = false;
            for l in text.lines() {
                let mut it = l.split_whitespace();
                let (Some(kind), Some(t)) = (it.next(), it.next().and_then(|t| t.parse().ok()))
                else {
                    continue;
                };
                if kind == "start" {
                    start = Some(t);
                }
                ended |= kind == "end";
                last = last.max(t);
            }
            if let Some(start) = start {
                v.push(Interval {
                    id: id.to_string(),
                    start,
                    last: last.max(start),
                    ended,
                });
            }
        }
        v.sort_by_key(|i| i.start);
        v
    }

    /// Panics unless no violation was recorded and no two jobs' intervals intersect. Returns the
    /// intervals.
    #[track_caller]
    pub fn verify(&self) -> Vec<Interval> {
        let mut violations = Vec::new();
        for e in fs::read_dir(&self.dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("violation-") {
                violations.push(fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        assert!(
            violations.is_empty(),
            "critical section entered while occupied: {violations:?}"
        );
        let v = self.intervals();
        for (i, later) in v.iter().enumerate() {
            for earlier in &v[..i] {
                assert!(
                    earlier.last < later.start,
                    "jobs overlapped: {} ran {}..{} (ended: {}) and {} started at {} ({} ns before the other's last sign of life)",
                    earlier.id,
                    earlier.start,
                    earlier.last,
                    earlier.ended,
                    later.id,
                    later.start,
                    earlier.last - later.start
                );
            }
        }
        v
    }
}
