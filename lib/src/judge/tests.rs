//! The judge's rules without /proc: a fake process table and a clock the test moves.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use super::*;
use crate::paths::LockPaths;
use crate::record::{Ending, Holder};

#[derive(Debug)]
struct FakeClock(Mutex<Duration>);
impl Clock for FakeClock {
    fn wall(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }
    fn boottime(&self) -> Duration {
        *self.0.lock().unwrap()
    }
}
impl FakeClock {
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

/// Live (pid, start) pairs, and what a dead holder's group still holds.
#[derive(Default)]
struct FakeProcs {
    alive: Vec<(i32, u64)>,
    left: HashMap<i32, Leftovers>,
}
impl Processes for FakeProcs {
    fn liveness(&self, pid: i32, start: u64) -> Liveness {
        if self.alive.contains(&(pid, start)) {
            Liveness::Alive
        } else {
            Liveness::Dead("process gone")
        }
    }
    fn leftovers(&self, _: &Lease, pgid: i32, _: &dyn Binding) -> Leftovers {
        self.left.get(&pgid).cloned().unwrap_or_default()
    }
}

const TTL: Duration = Duration::from_secs(30);

fn me() -> Identity {
    Identity {
        host: "here".into(),
        boot_id: "boot-here".into(),
        pid_ns: 7,
        uid: 1000,
        user: "alice".into(),
    }
}

fn lease(host: &str, state: LeaseState) -> Lease {
    Lease {
        state,
        heartbeat_seq: 3,
        heartbeat_at: "2026-11-29T16:08:33.123456Z".into(),
        lease_id: "6f1c0d5e9a2b4c7d8e9f0a1b2c3d4e5f".into(),
        token: 17,
        ttl_ms: TTL.as_millis() as u64,
        acquired_at: "2026-11-29T16:00:00.000000Z".into(),
        holder: Holder {
            pid: 4242,
            pid_start: 99,
            child_pid: Some(4243),
            child_start: Some(100),
            pgid: Some(4243),
            host: host.into(),
            boot_id: format!("boot-{host}"),
            pid_ns: 7,
            uid: 1000,
            user: "alice".into(),
            command: vec!["job".into()],
            note: None,
            on_behalf: false,
        },
        ended: (state != LeaseState::Held).then(|| Ending {
            at: "2026-11-29T16:09:00.000000Z".into(),
            how: "revoked by force: test".into(),
            by: Some("bob@here pid 1".into()),
        }),
        mode: None,
        history: Default::default(),
        damaged: false,
    }
}

fn content(l: &Lease) -> LockContent {
    LockContent::Lease(Box::new(l.clone()), l.to_bytes())
}

struct World {
    _dir: tempfile::TempDir,
    paths: LockPaths,
    me: Identity,
    clock: FakeClock,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let paths = LockPaths::new(dir.path().join("job.lock")).unwrap();
    World {
        _dir: dir,
        paths,
        me: me(),
        clock: FakeClock(Mutex::new(Duration::from_secs(1000))),
    }
}

impl World {
    fn judge(&self, c: &LockContent, mem: &mut Memory, p: &FakeProcs) -> Verdict {
        let j = Judge {
            binding: &self.paths,
            me: &self.me,
            clock: &self.clock,
            wall_skew: None,
            persist: false,
        };
        j.judge_by(c, mem, p)
    }
}

/// `v` is in `state`, and its reason says `says`.
fn expect(v: &Verdict, state: State, says: &str) {
    assert_eq!(v.state, state, "{}", v.reason);
    assert!(v.reason.contains(says), "{}", v.reason);
}

#[test]
fn free_when_missing_empty_or_released() {
    let w = world();
    let p = FakeProcs::default();
    let mut mem = Memory::default();
    for c in [
        LockContent::Missing,
        LockContent::Empty,
        content(&lease("here", LeaseState::Released)),
    ] {
        assert_eq!(w.judge(&c, &mut mem, &p).state, State::Free);
    }
}

#[test]
fn same_host_dead_holder_is_stale_at_once() {
    let w = world();
    let v = w.judge(
        &content(&lease("here", LeaseState::Held)),
        &mut Memory::default(),
        &FakeProcs::default(),
    );
    assert_eq!(v.state, State::Stale);
    assert!(v.same_host);
    assert_eq!(v.reason, "process gone");
    assert!(v.remnants.is_empty() && v.unchecked.is_none());
}

#[test]
fn same_host_dead_holder_reports_leftovers_and_unchecked() {
    let w = world();
    let mut p = FakeProcs::default();
    let left = Leftovers {
        belongs: vec![5000],
        unknown: 1,
        line: Some("pid 5001 cannot be checked".into()),
    };
    p.left.insert(4243, left);
    let v = w.judge(
        &content(&lease("here", LeaseState::Held)),
        &mut Memory::default(),
        &p,
    );
    assert_eq!(v.state, State::Stale);
    assert_eq!(v.remnants, vec![5000]);
    assert_eq!(v.unchecked.as_deref(), Some("pid 5001 cannot be checked"));
    assert!(v.reason.contains("1 leftover process(es)"), "{}", v.reason);
    assert!(v.reason.contains("cannot be checked"), "{}", v.reason);
}

#[test]
fn same_host_alive_is_held_then_hung_after_a_stalled_ttl() {
    let w = world();
    let p = FakeProcs {
        alive: vec![(4243, 100)], // only the command lives
        ..Default::default()
    };
    let c = content(&lease("here", LeaseState::Held));
    let mut mem = Memory::default();
    assert_eq!(w.judge(&c, &mut mem, &p).state, State::Held);
    w.clock.advance(TTL - Duration::from_millis(1));
    assert_eq!(w.judge(&c, &mut mem, &p).state, State::Held);
    w.clock.advance(Duration::from_millis(1));
    let v = w.judge(&c, &mut mem, &p);
    expect(&v, State::Hung, "frozen?");
    // A heartbeat that moves is a new observation: held again.
    let mut moved = lease("here", LeaseState::Held);
    moved.heartbeat_seq += 1;
    assert_eq!(w.judge(&content(&moved), &mut mem, &p).state, State::Held);
}

#[test]
fn foreign_is_stale_only_after_this_hosts_own_ttl() {
    let w = world();
    let p = FakeProcs {
        // A pid that is alive here means nothing for another host's holder.
        alive: vec![(4242, 99)],
        ..Default::default()
    };
    let c = content(&lease("there", LeaseState::Held));
    let mut mem = Memory::default();
    let v = w.judge(&c, &mut mem, &p);
    assert_eq!(v.state, State::Held);
    assert!(!v.same_host);
    w.clock.advance(TTL - Duration::from_millis(1));
    assert_eq!(w.judge(&c, &mut mem, &p).state, State::Held);
    // Another process of this host that never saw it (and no observation file): held.
    assert_eq!(w.judge(&c, &mut Memory::default(), &p).state, State::Held);
    w.clock.advance(Duration::from_millis(1));
    let v = w.judge(&c, &mut mem, &p);
    expect(&v, State::Stale, "no heartbeat seen from there");
    // Even the same host name on another boot is foreign.
    let mut rebooted = lease("here", LeaseState::Held);
    rebooted.holder.boot_id = "boot-earlier".into();
    let v = w.judge(&content(&rebooted), &mut Memory::default(), &p);
    assert!(!v.same_host);
    assert_eq!(v.state, State::Held);
}

#[test]
fn foreign_dead_holder_goes_stale_for_one_shot_callers_together() {
    let w = world();
    let p = FakeProcs::default();
    let c = content(&lease("there", LeaseState::Held));
    let j = Judge {
        binding: &w.paths,
        me: &w.me,
        clock: &w.clock,
        wall_skew: None,
        persist: true,
    };
    // Each one-shot caller has a fresh memory: the observation file carries it over.
    assert_eq!(
        j.judge_by(&c, &mut Memory::default(), &p).state,
        State::Held
    );
    w.clock.advance(TTL);
    assert_eq!(
        j.judge_by(&c, &mut Memory::default(), &p).state,
        State::Stale
    );
}

#[test]
fn revoked_same_host_is_held_while_alive_hung_after_ttl_stale_when_gone() {
    let w = world();
    let c = content(&lease("here", LeaseState::Revoked));
    let alive = FakeProcs {
        alive: vec![(4242, 99)],
        ..Default::default()
    };
    let mut mem = Memory::default();
    let v = w.judge(&c, &mut mem, &alive);
    assert_eq!(v.state, State::Held);
    assert!(v.reason.starts_with("revoked by bob@here"), "{}", v.reason);
    w.clock.advance(TTL);
    assert_eq!(w.judge(&c, &mut mem, &alive).state, State::Hung);
    let v = w.judge(&c, &mut mem, &FakeProcs::default());
    assert_eq!(v.state, State::Stale);
    assert!(v.reason.starts_with("revoked by"), "{}", v.reason);
}

#[test]
fn revoked_foreign_counts_its_ttl_from_the_revoked_record_not_the_heartbeat() {
    let w = world();
    let p = FakeProcs::default();
    let held = content(&lease("there", LeaseState::Held));
    let mut mem = Memory::default();
    assert_eq!(w.judge(&held, &mut mem, &p).state, State::Held);
    w.clock.advance(TTL - Duration::from_secs(1));
    // Revoked (same heartbeat sequence) just before the heartbeat would have gone stale.
    let revoked = content(&lease("there", LeaseState::Revoked));
    let v = w.judge(&revoked, &mut mem, &p);
    assert_eq!(v.state, State::Held);
    assert_eq!(v.heartbeat_age, Some(Duration::ZERO));
    w.clock.advance(TTL - Duration::from_millis(1));
    assert_eq!(w.judge(&revoked, &mut mem, &p).state, State::Held);
    w.clock.advance(Duration::from_millis(1));
    let v = w.judge(&revoked, &mut mem, &p);
    expect(&v, State::Stale, "revoked record unchanged");
}

#[test]
fn damaged_record_is_judged_by_its_bytes_alone_even_on_this_host() {
    let w = world();
    // Its processes "live", but a damaged record's content is not trusted.
    let p = FakeProcs {
        alive: vec![(4242, 99), (4243, 100)],
        ..Default::default()
    };
    let mut l = lease("here", LeaseState::Held);
    l.damaged = true;
    let c = content(&l);
    let mut mem = Memory::default();
    let v = w.judge(&c, &mut mem, &p);
    expect(&v, State::Held, "record damaged");
    w.clock.advance(TTL);
    let v = w.judge(&c, &mut mem, &p);
    assert_eq!(v.state, State::Stale);
    assert!(v.reason.ends_with("the record is damaged"), "{}", v.reason);
    // Other bytes are another observation: the TTL starts again.
    let mut other = l.clone();
    other.token += 1;
    assert_eq!(w.judge(&content(&other), &mut mem, &p).state, State::Held);
}

#[test]
fn wall_clock_shortcut_is_opt_in() {
    let w = world();
    let p = FakeProcs::default();
    let c = content(&lease("there", LeaseState::Held)); // written long before "now"
    let mut j = Judge {
        binding: &w.paths,
        me: &w.me,
        clock: &w.clock,
        wall_skew: None,
        persist: false,
    };
    assert_eq!(
        j.judge_by(&c, &mut Memory::default(), &p).state,
        State::Held
    );
    j.wall_skew = Some(Duration::from_secs(600));
    let v = j.judge_by(&c, &mut Memory::default(), &p);
    expect(&v, State::Stale, "allowed skew");
}

#[test]
fn a_script_mode_lease_lives_with_its_script_not_its_keeper() {
    let w = world();
    let mut l = lease("here", LeaseState::Held);
    l.holder.on_behalf = true; // pid 4242 is the keeper, child 4243 the script
    let c = content(&l);
    let mut mem = Memory::default();
    // Keeper alive, script gone: stale at once, whatever the keeper does.
    let keeper_only = FakeProcs {
        alive: vec![(4242, 99)],
        ..Default::default()
    };
    expect(
        &w.judge(&c, &mut mem, &keeper_only),
        State::Stale,
        "script exited",
    );
    // Keeper gone, script alive: held, and hung once the heartbeat has not moved for a TTL.
    let script_only = FakeProcs {
        alive: vec![(4243, 100)],
        ..Default::default()
    };
    expect(&w.judge(&c, &mut mem, &script_only), State::Held, "alive");
    w.clock.advance(TTL);
    expect(&w.judge(&c, &mut mem, &script_only), State::Hung, "frozen");
}
