//! The one critical-section checker, shared by every test that proves mutual exclusion: jobs
//! of other users (a shell script, `job.sh`), commands under `leasehold run`, and library
//! holders (the Rust side, [`Cs::enter`]) all follow one protocol in one directory.
//!
//! On entering, a job creates `DIR/inside` exclusively, holding `ID PID START` (its id, pid and
//! start time): the shell job with O_EXCL (`set -C`), the Rust side by hard-linking a complete
//! file (as exclusive as O_EXCL, and a kill between create and write cannot leave it empty). If
//! `inside` exists, the one inside must be
//! - a job the test declared killed (`DIR/killed-ID`, or `DIR/killed-NAME` for every id
//!   `NAME.N`, written before the SIGKILL) whose process is verifiably dead (gone, a zombie, or
//!   its pid reused), or
//! - when the test allows fencing ([`Cs::allow_fenced`]: leasehold itself stops or kills a hung
//!   holder's processes before a takeover), a process that is dead or stopped;
//!
//! the newcomer then replaces the leftover. Anything else is a violation, appended to
//! `DIR/violation-ID`, as is leaving a section whose `inside` is no longer one's own. A job
//! writes `DIR/entered-ID` (the marker that says a kill lands inside the section), logs
//! `start`, `tick`s, `end` to `DIR/job-ID`, and removes `inside`. Every log line carries
//! CLOCK_REALTIME in ns; [`Cs::verify`] checks that no violation was recorded and that no two
//! jobs' intervals (start .. last line) intersect, which also catches a job replaced while
//! stopped that then ran on. Each job writes only files of its own, so jobs of users with any
//! umask can share the directory (mode 0777, not sticky).
//!
//! **Shared and counting mode** ([`Cs::enter_as`], for `--shared` and `--slots N`): a section is
//! exclusive or shared. Each occupant creates `DIR/in/ID` exclusively (its own file), then
//! lists `DIR/in/`: an exclusive occupant must find nobody else, a shared one no exclusive one
//! and at most LIMIT occupants in all (itself included) — dead occupants declared killed are
//! removed first, as above. Whoever of two overlapping occupants created its file second lists
//! the other's, so every overlap is recorded. [`Cs::verify_shared`] checks the intervals too: no
//! exclusive interval intersects another, and never more than LIMIT intersect at one instant.
//!
//! Shell jobs are `sh DIR/job.sh DIR ID TICKS PERIOD`: TICKS ticks of PERIOD seconds (or until
//! `DIR/release-ID` exists); with TICKS 0 the shell itself blocks on a FIFO until released.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;
use std::time::{SystemTime, UNIX_EPOCH};

use super::procfs;
use super::wait::wait_until;

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", p.display()));
}

/// Appends a violation to `DIR/violation-ID` (appended, so that a section that both entered and
/// left wrongly keeps both lines).
fn record_violation(dir: &Path, id: &str, line: &str) {
    let v = dir.join(format!("violation-{id}"));
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&v)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .unwrap_or_else(|e| panic!("cs: write {}: {e}", v.display()));
}

/// CLOCK_REALTIME in ns, as `date +%s%N` prints it.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

const SCRIPT: &str = r#"cs=$1 id=$2 ticks=$3 period=$4
dead() {
  want=$2
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  [ -n "$s" ] || return 0
  set -- $s
  [ "$3" = Z ] || [ "$3" = X ] || [ "${22}" != "$want" ]
}
stopped() {
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  set -- $s
  [ "$3" = T ] || [ "$3" = t ]
}
set -- $(cat /proc/$$/stat)
me="$id $$ ${22}"
# The marker appears whole (renamed into place): a reader that sees it can read the pid.
entered() { printf '%s\n' "$me" > "$cs/entered-$id.tmp" && mv -f "$cs/entered-$id.tmp" "$cs/entered-$id"; }
if ! (set -C; printf '%s\n' "$me" > "$cs/inside") 2>/dev/null; then
  oid= opid= ost=
  read -r oid opid ost < "$cs/inside" 2>/dev/null
  if [ -n "$oid" ] && { [ -e "$cs/killed-$oid" ] || [ -e "$cs/killed-${oid%%.*}" ]; } && dead "$opid" "$ost"; then
    printf '%s\n' "$me" > "$cs/inside.$id" && mv -f "$cs/inside.$id" "$cs/inside"
  elif [ -n "$oid" ] && [ -e "$cs/fenced-ok" ] && { dead "$opid" "$ost" || stopped "$opid"; }; then
    printf '%s\n' "$me" > "$cs/inside.$id" && mv -f "$cs/inside.$id" "$cs/inside"
  else
    printf '%s entered while %s (pid %s) was inside\n' "$id" "${oid:-?}" "${opid:-?}" >> "$cs/violation-$id"
  fi
fi
echo "start $(date +%s%N)" > "$cs/job-$id"
if [ "$ticks" = 0 ]; then
  # Held until the test writes to the FIFO: no child process meanwhile.
  exec 3<>"$cs/fifo-$id"
  entered
  read -r x <&3
  ticks=0
fi
[ -e "$cs/entered-$id" ] || entered
i=0
while [ "$i" -lt "$ticks" ] && [ ! -e "$cs/release-$id" ]; do
  sleep "$period"
  i=$((i+1))
  echo "tick $(date +%s%N)" >> "$cs/job-$id"
done
echo "end $(date +%s%N)" >> "$cs/job-$id"
oid=
read -r oid rest < "$cs/inside" 2>/dev/null
if [ "$oid" = "$id" ]; then
  rm -f "$cs/inside"
else
  printf '%s left while %s was inside\n' "$id" "${oid:-nobody}" >> "$cs/violation-$id"
fi
exit 0
"#;

pub struct Cs {
    pub dir: PathBuf,
}

/// What a section of a shared or counted lock is (see [`Cs::enter_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Alone: nobody else inside.
    Exclusive,
    /// With other shared sections (at most the limit together), never with an exclusive one.
    Shared,
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

    /// Violations recorded so far.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        for e in fs::read_dir(&self.dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("violation-") {
                v.push(fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        v
    }

    /// Panics unless no violation was recorded and no two jobs' intervals intersect. Returns the
    /// intervals.
    #[track_caller]
    pub fn verify(&self) -> Vec<Interval> {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "critical section entered while occupied: {violations:?}"
        );
        let v = self.intervals();
        let overlaps = overlaps(&v);
        assert!(overlaps.is_empty(), "jobs overlapped: {overlaps:#?}");
        v
    }

    /// Ids of sections that started and never ended: killed (or fenced) inside.
    pub fn unfinished(&self) -> Vec<String> {
        self.intervals()
            .into_iter()
            .filter(|i| !i.ended)
            .map(|i| i.id)
            .collect()
    }

    /// Once inside: starts the section's log, writes its `entered-ID` marker (`me`, the
    /// occupant line) and returns the section.
    fn started(&self, id: &str, me: &str, shared: bool) -> Section {
        let log = self.dir.join(format!("job-{id}"));
        fs::write(&log, format!("start {}\n", now_ns()))
            .unwrap_or_else(|e| panic!("cs: write {}: {e}", log.display()));
        // Whole or not at all, as the job script's marker (see `entered` there).
        let tmp = self.dir.join(format!("entered-{id}.tmp"));
        fs::write(&tmp, me).expect("cs: write entered");
        fs::rename(&tmp, self.dir.join(format!("entered-{id}"))).expect("cs: rename entered");
        Section {
            cs: Cs::open(&self.dir),
            id: id.to_string(),
            log,
            shared,
        }
    }

    /// A checker in an existing directory (a worker's view of the test's checker).
    pub fn open(dir: &Path) -> Cs {
        Cs {
            dir: dir.to_path_buf(),
        }
    }

    /// Lets a newcomer replace an occupant that is dead or stopped without a declared kill:
    /// for tests where leasehold itself stops or kills a hung holder before a takeover.
    pub fn allow_fenced(&self) {
        fs::write(self.dir.join("fenced-ok"), "").unwrap();
    }

    fn may_replace(&self, occupant: &str) -> bool {
        let mut it = occupant.split_whitespace();
        let (Some(oid), Some(pid), Some(start)) = (
            it.next(),
            it.next().and_then(|p| p.parse::<i32>().ok()),
            it.next().and_then(|s| s.parse::<u64>().ok()),
        ) else {
            return false;
        };
        let dead = procfs::stat(pid)
            .is_none_or(|(state, st)| st != start || matches!(state, 'Z' | 'X' | 'x'));
        let name = oid.split('.').next().unwrap_or(oid);
        let declared = self.dir.join(format!("killed-{oid}")).exists()
            || self.dir.join(format!("killed-{name}")).exists();
        if declared && dead {
            return true;
        }
        self.dir.join("fenced-ok").exists() && (dead || procfs::is_stopped(pid))
    }

    /// Enters the critical section as job `id` (the Rust side of `job.sh`). Every failure to
    /// write the checker's files panics: a checker that cannot record must not pass.
    pub fn enter(&self, id: &str) -> Section {
        let pid = std::process::id() as i32;
        let start = procfs::start_time(pid).expect("own start time");
        let me = format!("{id} {pid} {start}\n");
        let inside = self.dir.join("inside");
        let mine = self.dir.join(format!("inside.{id}"));
        fs::write(&mine, &me).unwrap_or_else(|e| panic!("cs: write {}: {e}", mine.display()));
        match fs::hard_link(&mine, &inside) {
            Ok(()) => fs::remove_file(&mine).expect("cs: remove own temp"),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let occupant = fs::read_to_string(&inside).unwrap_or_default();
                if self.may_replace(&occupant) {
                    fs::rename(&mine, &inside).expect("cs: replace a dead occupant");
                } else {
                    let _ = fs::remove_file(&mine);
                    record_violation(
                        &self.dir,
                        id,
                        &format!("{id} entered while `{}` was inside\n", occupant.trim()),
                    );
                }
            }
            Err(e) => panic!("cs: link {}: {e}", inside.display()),
        }
        self.started(id, &me, false)
    }
}

impl Cs {
    /// Enters as job `id` of kind `kind` in shared or counting mode (see the module comment):
    /// at most `limit` sections inside together, an exclusive one alone.
    pub fn enter_as(&self, id: &str, kind: Kind, limit: usize) -> Section {
        let pid = std::process::id() as i32;
        let start = procfs::start_time(pid).expect("own start time");
        let tag = match kind {
            Kind::Exclusive => "x",
            Kind::Shared => "s",
        };
        let me = format!("{id} {pid} {start} {tag}\n");
        let dir = self.dir.join("in");
        let _ = fs::create_dir(&dir);
        let kind_file = self.dir.join(format!("kind-{id}"));
        fs::write(&kind_file, tag)
            .unwrap_or_else(|e| panic!("cs: write {}: {e}", kind_file.display()));
        let mine = dir.join(id);
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&mine)
            .and_then(|mut f| f.write_all(me.as_bytes()))
            .unwrap_or_else(|e| panic!("cs: create {}: {e}", mine.display()));
        let mut others = Vec::new();
        for e in fs::read_dir(&dir).expect("cs: list in/").flatten() {
            if e.file_name() == std::ffi::OsStr::new(id) {
                continue;
            }
            let occupant = fs::read_to_string(e.path()).unwrap_or_default();
            if occupant.is_empty() {
                continue; // left meanwhile (or not written yet: it will list us)
            }
            if self.may_replace(&occupant) {
                let _ = fs::remove_file(e.path());
            } else {
                others.push(occupant.trim().to_string());
            }
        }
        let exclusive_inside = others.iter().any(|o| o.ends_with(" x"));
        let bad = match kind {
            Kind::Exclusive => !others.is_empty(),
            Kind::Shared => exclusive_inside || others.len() + 1 > limit,
        };
        if bad {
            record_violation(
                &self.dir,
                id,
                &format!("{id} ({tag}, limit {limit}) entered while inside: {others:?}\n"),
            );
        }
        self.started(id, &me, true)
    }

    /// The kind job `id` entered as ([`Cs::enter_as`]); `None` for a plain section.
    pub fn kind(&self, id: &str) -> Option<Kind> {
        match fs::read_to_string(self.dir.join(format!("kind-{id}")))
            .ok()?
            .trim()
        {
            "x" => Some(Kind::Exclusive),
            "s" => Some(Kind::Shared),
            _ => None,
        }
    }

    /// For shared or counting mode: panics unless no violation was recorded, no exclusive
    /// interval intersects another, and at no instant more than `limit` intervals intersect.
    /// Returns the intervals and the most that were ever inside together.
    #[track_caller]
    pub fn verify_shared(&self, limit: usize) -> (Vec<Interval>, usize) {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "critical section entered against its kind or limit: {violations:?}"
        );
        let v = self.intervals();
        let exclusive: Vec<bool> = v
            .iter()
            .map(|i| self.kind(&i.id) == Some(Kind::Exclusive))
            .collect();
        let mut bad = Vec::new();
        // Sorted by start: only the intervals starting before `a` ends can meet it.
        for (i, a) in v.iter().enumerate() {
            for (j, b) in v.iter().enumerate().skip(i + 1) {
                if b.start > a.last {
                    break;
                }
                if exclusive[i] || exclusive[j] {
                    bad.push(format!("{} and {} overlapped, one exclusive", a.id, b.id));
                }
            }
        }
        // Sweep: +1 at each start, -1 after each last sign of life.
        let mut events: Vec<(u128, i32)> = v
            .iter()
            .flat_map(|i| [(i.start, 1), (i.last + 1, -1)])
            .collect();
        events.sort();
        let (mut now, mut most) = (0i32, 0i32);
        for (_, d) in events {
            now += d;
            most = most.max(now);
        }
        assert!(bad.is_empty(), "exclusive sections overlapped: {bad:#?}");
        assert!(
            most as usize <= limit,
            "{most} sections were inside together, more than the limit {limit}"
        );
        (v, most as usize)
    }
}

/// A critical section entered with [`Cs::enter`] (or [`Cs::enter_as`]); [`Section::leave`]
/// ends it.
pub struct Section {
    cs: Cs,
    id: String,
    log: PathBuf,
    /// Entered with [`Cs::enter_as`]: its occupant file is `in/ID`.
    shared: bool,
}

impl Section {
    fn append(&self, what: &str) {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("cs: open {}: {e}", self.log.display()));
        f.write_all(format!("{what} {}\n", now_ns()).as_bytes())
            .unwrap_or_else(|e| panic!("cs: append to {}: {e}", self.log.display()));
    }

    /// Logs the end and removes `inside` (or, in shared mode, `in/ID`), which must still be
    /// this section's.
    pub fn leave(self) {
        self.append("end");
        if self.shared {
            let mine = self.cs.dir.join("in").join(&self.id);
            if fs::remove_file(&mine).is_err() {
                record_violation(
                    &self.cs.dir,
                    &self.id,
                    &format!("{} left, but its occupant file was gone\n", self.id),
                );
            }
            return;
        }
        let inside = self.cs.dir.join("inside");
        let occupant = fs::read_to_string(&inside).unwrap_or_default();
        if occupant.split_whitespace().next() == Some(self.id.as_str()) {
            fs::remove_file(&inside).expect("cs: remove inside");
        } else {
            record_violation(
                &self.cs.dir,
                &self.id,
                &format!("{} left while `{}` was inside\n", self.id, occupant.trim()),
            );
        }
    }
}

/// Pairs of intervals that intersect, described (intervals sorted by start).
pub fn overlaps(v: &[Interval]) -> Vec<String> {
    let mut out = Vec::new();
    let mut latest: Option<&Interval> = None;
    for later in v {
        if let Some(earlier) = latest
            && earlier.last >= later.start
        {
            out.push(format!(
                "{} ran {}..{} (ended: {}) and {} started at {} ({} ns before the other's last sign of life)",
                earlier.id,
                earlier.start,
                earlier.last,
                earlier.ended,
                later.id,
                later.start,
                earlier.last - later.start
            ));
        }
        if latest.is_none_or(|e| later.last > e.last) {
            latest = Some(later);
        }
    }
    out
}

/// The command of a `--slots 2` contender: takes one of two slot files with O_EXCL (`set -C`),
/// or records a violation when both are taken (a third inside); records `two` when it took
/// the second while the first was held (two inside together); holds a moment; gives it back.
pub fn slot_script(dir: &Path, id: &str) -> String {
    format!(
        "cd {d}; \
         if (set -C; : > slot-0) 2>/dev/null; then s=0; \
         elif (set -C; : > slot-1) 2>/dev/null; then s=1; echo {id} >> two; \
         else echo {id} >> violation; exit 0; fi; \
         echo \"$LEASEHOLD_TOKEN\" >> tokens; sleep 0.05; rm -f slot-$s",
        d = dir.display()
    )
}

/// The command of a readers-writer contender: an exclusive one takes the directory `w` (mkdir,
/// atomic) and must find no reader in `r/`; a shared one creates `r/ID` and must find no `w`.
/// Whichever of two overlapping sections entered second sees the other, so every overlap of an
/// exclusive section with another is recorded in `violation`; a shared one that finds another
/// reader beside it records `together`. Each holds a moment, then leaves.
pub fn rw_script(dir: &Path, id: &str, exclusive: bool) -> String {
    let d = dir.display();
    if exclusive {
        format!(
            "cd {d}; mkdir w 2>/dev/null || echo \"{id}: w taken\" >> violation; \
             [ -z \"$(ls r)\" ] || echo \"{id}: readers $(ls r)\" >> violation; \
             echo \"x $LEASEHOLD_TOKEN\" >> tokens; sleep 0.03; rmdir w"
        )
    } else {
        format!(
            "cd {d}; : > r/{id}; [ -d w ] && echo \"{id}: beside a writer\" >> violation; \
             [ \"$(ls r | wc -l)\" -gt 1 ] && echo {id} >> together; \
             echo \"s $LEASEHOLD_TOKEN\" >> tokens; sleep 0.05; rm r/{id}"
        )
    }
}

/// What the `runs` jobs of [`slot_script`] left in `dir`, checked: none was a third inside, each
/// ran its command once, every token unique. Returns how many times two were inside together.
pub fn slot_outcome(dir: &Path, runs: usize) -> usize {
    let violations = fs::read_to_string(dir.join("violation")).unwrap_or_default();
    assert!(violations.is_empty(), "a third inside: {violations}");
    let tokens: Vec<u64> = fs::read_to_string(dir.join("tokens"))
        .unwrap()
        .lines()
        .map(|l| l.parse().expect("a token"))
        .collect();
    assert_eq!(tokens.len(), runs, "every run ran its command once");
    let distinct: std::collections::HashSet<_> = tokens.iter().collect();
    assert_eq!(
        distinct.len(),
        tokens.len(),
        "tokens are unique: {tokens:?}"
    );
    fs::read_to_string(dir.join("two"))
        .unwrap_or_default()
        .lines()
        .count()
}

/// What the `runs` jobs of [`rw_script`] left in `dir`, checked: no writer beside anyone, each
/// ran its command once. Returns how many were exclusive, and how many times readers were
/// inside together.
pub fn rw_outcome(dir: &Path, runs: usize) -> (usize, usize) {
    let violations = fs::read_to_string(dir.join("violation")).unwrap_or_default();
    assert!(violations.is_empty(), "a writer overlapped: {violations}");
    let tokens = fs::read_to_string(dir.join("tokens")).unwrap();
    assert_eq!(
        tokens.lines().count(),
        runs,
        "every run ran its command once"
    );
    let writers = tokens.lines().filter(|l| l.starts_with("x ")).count();
    let together = fs::read_to_string(dir.join("together")).unwrap_or_default();
    (writers, together.lines().count())
}
