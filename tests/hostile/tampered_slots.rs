//! Hostile directory writers, round two (issue 26): a member of a group-shared directory tampers
//! with a shared or counted lock's records — removes a holder file, forges LOCK's width, or
//! replaces LOCK with a released or a stale record — while other members hold it, and root's
//! routine contender must still never be one holder too many (`--slots 2`), nor an exclusive
//! holder beside shared ones: the holders' kernel marks count, not the files (PROTOCOL.md §13).
//!
//! Root only, like `round_two.rs` (whose [`attack_scene`] every test here uses). The jobs are
//! checked by a shared-mode critical-section checker in the shell (`sjob.sh`, below: the
//! protocol of `Cs::enter_as`, for jobs of other users), verified with `Cs::verify_shared`;
//! every test ends with `Scene::finish` (no bystander signalled). Each test first confirms that
//! the attack is in place (the file removed or forged, the holders' jobs alive).

use super::harness;
use super::multiuser::{read_lease, s};
use super::round_two::{attack_scene, helper};

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use crate::support::cs::Cs;
use harness::{LONG, Outcome, Proc, Scene, Snapshot, Who, describe};
use nix::sys::signal::Signal;

/// A job of kind TAG (`s` shared, `x` exclusive) under LIMIT: creates `DIR/in/ID` exclusively,
/// lists `DIR/in/` and records a violation if an exclusive job meets anyone or more than LIMIT
/// are inside (dead occupants, whose holder fenced them, are removed first), logs start and end
/// to `DIR/job-ID`, writes `DIR/entered-ID` (`ID PID START`) and blocks on `DIR/fifo-ID` until
/// `Cs::release`.
const SJOB: &str = r#"cs=$1 id=$2 tag=$3 limit=$4
dead() {
  want=$2
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  [ -n "$s" ] || return 0
  set -- $s
  [ "$3" = Z ] || [ "$3" = X ] || [ "${22}" != "$want" ]
}
set -- $(cat /proc/$$/stat)
st=${22}
mkdir -p "$cs/in" 2>/dev/null
printf '%s\n' "$tag" > "$cs/kind-$id"
if ! (set -C; printf '%s\n' "$id $$ $st $tag" > "$cs/in/$id") 2>/dev/null; then
  printf '%s: in/%s exists\n' "$id" "$id" >> "$cs/violation-$id"
fi
n=1 others= bad=
for f in "$cs/in"/*; do
  [ "$f" = "$cs/in/$id" ] && continue
  [ -e "$f" ] || continue
  oid= opid= ost= otag=
  read -r oid opid ost otag < "$f"
  [ -n "$oid" ] || continue
  if dead "$opid" "$ost"; then rm -f "$f"; continue; fi
  n=$((n+1)) others="$others $oid($otag)"
  if [ "$otag" = x ] || [ "$tag" = x ]; then bad=1; fi
done
[ "$n" -le "$limit" ] || bad=1
if [ -n "$bad" ]; then
  printf '%s (%s, limit %s) entered while inside:%s\n' "$id" "$tag" "$limit" "$others" >> "$cs/violation-$id"
fi
echo "start $(date +%s%N)" > "$cs/job-$id"
exec 3<>"$cs/fifo-$id"
printf '%s\n' "$id $$ $st" > "$cs/entered-$id.tmp" && mv -f "$cs/entered-$id.tmp" "$cs/entered-$id"
read -r x <&3
echo "end $(date +%s%N)" >> "$cs/job-$id"
rm -f "$cs/in/$id"
exit 0
"#;

/// The shared-mode checker of one test: a [`Cs`] directory `scs` with `sjob.sh` in it.
fn shared_cs(sc: &Scene) -> Cs {
    let cs = Cs::new(&sc.w.base, "scs");
    let job = cs.dir.join("sjob.sh");
    fs::write(&job, SJOB).unwrap();
    harness::chmod(&job, 0o755);
    cs
}

/// Starts `leasehold run PRE LOCK -- sjob ID TAG LIMIT` as `who` and waits up to `limit` for
/// the job to enter: the holder, or how it ended without entering.
#[allow(clippy::too_many_arguments)]
fn hold(
    sc: &Scene,
    cs: &Cs,
    who: Who,
    pre: &[&str],
    lock: &Path,
    id: &str,
    tag: &str,
    limit: Duration,
) -> Result<Proc, Outcome> {
    let fifo = cs.dir.join(format!("fifo-{id}"));
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    harness::chmod(&fifo, 0o666);
    let job = cs.dir.join("sjob.sh");
    let mut args = vec!["run"];
    args.extend(pre);
    args.extend([s(lock), "--", "sh", s(&job), s(&cs.dir), id, tag, "2"]);
    let mut p = sc.spawn_as(who, 0o002, &args);
    if harness::wait_until(limit, || {
        cs.entered(id) || p.child.try_wait().unwrap().is_some()
    }) && cs.entered(id)
    {
        Ok(p)
    } else {
        Err(p.finish(LONG))
    }
}

/// A member's holder that must enter: panics otherwise; its job confirmed alive.
fn member_holds(sc: &Scene, cs: &Cs, who: Who, pre: &[&str], lock: &Path, id: &str) -> Proc {
    let p = hold(sc, cs, who, pre, lock, id, "s", LONG).unwrap_or_else(|o| {
        panic!(
            "{} could not take {} {pre:?}: {}",
            who.name(),
            s(lock),
            describe(&o)
        )
    });
    let job = cs.job_pid(id).expect("the job's pid");
    assert!(!harness::is_dead(job) && !harness::is_dead(p.pid()));
    p
}

/// Root's contender `run PRE LOCK -- sjob ID TAG` must not enter: it ends (75: busy, or a
/// timeout) without its job having entered. If it did enter, the failure is recorded and its
/// job released.
fn root_kept_out(sc: &Scene, cs: &Cs, pre: &[&str], lock: &Path, id: &str, tag: &str, what: &str) {
    match hold(
        sc,
        cs,
        Who::Root,
        pre,
        lock,
        id,
        tag,
        Duration::from_secs(15),
    ) {
        Ok(mut p) => {
            sc.check(false, || {
                format!("{what}: root's run {pre:?} entered beside the holders")
            });
            cs.release(id);
            let _ = p.finish(LONG);
        }
        Err(o) => sc.expect(o.code == 75, &o, format!("{what}: root's run {pre:?}")),
    }
}

/// Jobs `ids` still alive (their shells), with their holders `procs`.
fn alive(sc: &Scene, cs: &Cs, ids: &[&str], procs: &[&Proc], what: &str) {
    for id in ids {
        let pid = cs.job_pid(id).expect("entered");
        sc.check(!harness::is_dead(pid), || format!("{what}: job {id} died"));
    }
    for p in procs {
        sc.check(!harness::is_dead(p.pid()), || {
            format!("{what}: holder {} died", p.name)
        });
    }
}

/// Releases job `id` and expects its holder to exit 0.
fn release(sc: &Scene, cs: &Cs, mut p: Proc, id: &str) {
    cs.release(id);
    let o = p.finish(LONG);
    sc.expect_ok(&o, format!("holder of {id}, released"));
}

/// A file of root's in the checker directory holding `lease`, which member `who` then copies
/// beside LOCK and renames over it (a directory writer's forgery).
fn forge_lock(sc: &Scene, cs: &Cs, who: Who, lock: &Path, lease: &leasehold::Lease) {
    let forged = cs.dir.join("forged-lease");
    fs::write(&forged, lease.to_bytes()).unwrap();
    harness::chmod(&forged, 0o644);
    sc.w.sh(
        who,
        0o002,
        "cp \"$1\" \"$2.f\" && mv -f \"$2.f\" \"$2\"",
        &[s(&forged), s(lock)],
    );
}

/// A record made by hand: held by `pid` (start `start`) on this host as member `who`, token
/// `token`.
fn crafted(sc: &Scene, who: Who, pid: i32, start: u64, token: u64) -> leasehold::Lease {
    let mut me = leasehold::Identity::current();
    (me.uid, me.user) = (who.uid(), who.name());
    let _ = sc;
    crate::support::crafted(pid, start, &me, Duration::from_secs(30), token)
}

/// The token of the record in `path`.
fn token(path: &Path) -> u64 {
    read_lease(path)["token"].as_u64().expect("a token")
}

/// Members A and B hold two slots of `--slots 2` (holder files 0 and 1). B's wrapper is
/// stopped (so it cannot notice anything: a holder that has not noticed yet), then member C
/// removes B's holder file. Root's `run -n --slots 2` and `run -w 1 --slots 2` must not enter
/// as a third holder (before: root took the freed file and three were inside). Once B's wrapper
/// is continued it fences its job (74); root then gets the slot.
#[test]
fn a_removed_slot_file_never_lets_a_third_holder_into_two_slots() {
    let test = "a_removed_slot_file_never_lets_a_third_holder_into_two_slots";
    let Some((_p, sc, lock)) = attack_scene(test) else {
        return;
    };
    let cs = shared_cs(&sc);
    let slots = ["--slots", "2"];
    let a = member_holds(&sc, &cs, sc.a(), &slots, &lock, "a");
    let mut b = member_holds(&sc, &cs, sc.b(), &slots, &lock, "b");
    let files = [helper(&lock, "slot-0"), helper(&lock, "slot-1")];
    let b_file = files
        .iter()
        .find(|f| read_lease(f)["holder"]["pid"].as_i64() == Some(i64::from(b.pid())))
        .expect("B's holder file")
        .clone();
    b.signal(Signal::SIGSTOP);
    assert!(harness::wait_until(Duration::from_secs(5), || {
        crate::support::procfs::is_stopped(b.pid())
    }));
    sc.w.sh(sc.c(), 0o002, "rm -f \"$1\"", &[s(&b_file)]);
    // In place: B's file gone, both jobs alive, B's wrapper stopped.
    assert!(!b_file.exists());
    alive(&sc, &cs, &["a", "b"], &[&a, &b], "after the removal");
    for (pre, id) in [(["-n"], "r1"), (["-w"], "r2")] {
        let mut args = vec![pre[0]];
        if pre[0] == "-w" {
            args.push("1");
        }
        args.extend(slots);
        root_kept_out(&sc, &cs, &args, &lock, id, "s", "B's holder file removed");
    }
    alive(&sc, &cs, &["a", "b"], &[&a, &b], "after root's tries");
    // B's wrapper, continued, notices its file gone and fences its job; its place then frees.
    b.signal(Signal::SIGCONT);
    let o = b.finish(LONG);
    sc.expect(
        o.code == 74,
        &o,
        "B's holder, continued after its file was removed",
    );
    match hold(
        &sc,
        &cs,
        Who::Root,
        &["-w", "20", "--slots", "2"],
        &lock,
        "r3",
        "s",
        LONG,
    ) {
        Ok(p) => release(&sc, &cs, p, "r3"),
        Err(o) => sc.expect(false, &o, "root's run -w 20 once B fenced"),
    }
    release(&sc, &cs, a, "a");
    cs.verify_shared(2);
    sc.finish();
}

/// Members A and B hold two slots of `--slots 2`; member C replaces LOCK with a forged shared
/// record whose width is 1 (only holder file 0 in use). Root's `run -n --slots 2` must not
/// enter as a third holder, nor write B's holder file (before: root took holder file 1 over
/// B's lease, and three were inside). Once A releases, root gets a slot, beside B.
#[test]
fn a_forged_width_never_lets_a_third_holder_into_two_slots() {
    let test = "a_forged_width_never_lets_a_third_holder_into_two_slots";
    let Some((_p, sc, lock)) = attack_scene(test) else {
        return;
    };
    let cs = shared_cs(&sc);
    let slots = ["--slots", "2"];
    let a = member_holds(&sc, &cs, sc.a(), &slots, &lock, "a");
    let b = member_holds(&sc, &cs, sc.b(), &slots, &lock, "b");
    let one = helper(&lock, "slot-1");
    let b_before = Snapshot::of(&one);
    let mut lease = crafted(&sc, sc.c(), 1, 0, token(&lock));
    lease.state = leasehold::LeaseState::Released;
    lease.mode = Some(leasehold::Mode {
        slots: Some(2),
        width: 1,
    });
    forge_lock(&sc, &cs, sc.c(), &lock, &lease);
    // In place: LOCK says width 1, written by C; both jobs alive.
    let l = read_lease(&lock);
    assert_eq!(l["mode"]["width"].as_u64(), Some(1), "{l}");
    assert_eq!(fs::metadata(&lock).unwrap().uid(), sc.w.c.uid);
    alive(&sc, &cs, &["a", "b"], &[&a, &b], "after the forgery");
    root_kept_out(
        &sc,
        &cs,
        &["-n", "--slots", "2"],
        &lock,
        "r1",
        "s",
        "width forged",
    );
    alive(&sc, &cs, &["a", "b"], &[&a, &b], "after root's try");
    sc.check(Snapshot::of(&one) == b_before, || {
        "root's contender wrote over holder file 1 (B's lease)".into()
    });
    release(&sc, &cs, a, "a");
    match hold(
        &sc,
        &cs,
        Who::Root,
        &["-w", "20", "--slots", "2"],
        &lock,
        "r2",
        "s",
        LONG,
    ) {
        Ok(p) => release(&sc, &cs, p, "r2"),
        Err(o) => sc.expect(false, &o, "root's run -w 20 once A released"),
    }
    release(&sc, &cs, b, "b");
    cs.verify_shared(2);
    sc.finish();
}

/// Members A and B hold `--shared` leases; member C replaces LOCK with a plain released record
/// whose token is above theirs, then with a plain lease of a dead process on this host (stale).
/// Root's plain (exclusive) `run -n` must not enter beside the shared holders either time
/// (before: it entered at once on the released record), and root's `status` says held. Once
/// both release, root's exclusive run enters.
#[test]
fn a_replaced_lock_record_never_lets_an_exclusive_holder_beside_shared_ones() {
    let test = "a_replaced_lock_record_never_lets_an_exclusive_holder_beside_shared_ones";
    let Some((_p, sc, lock)) = attack_scene(test) else {
        return;
    };
    let cs = shared_cs(&sc);
    let a = member_holds(&sc, &cs, sc.a(), &["--shared"], &lock, "a");
    let b = member_holds(&sc, &cs, sc.b(), &["--shared"], &lock, "b");
    let top = token(&helper(&lock, "slot-0")).max(token(&helper(&lock, "slot-1")));
    // A process of this host that has ended: its pid and start time name nobody alive.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id() as i32;
    let gone_start = harness::start_time(gone_pid).unwrap_or(1);
    gone.wait().unwrap();
    let mut released = crafted(&sc, sc.c(), 1, 0, top + 10);
    released.state = leasehold::LeaseState::Released;
    released.ended = Some(leasehold::Ending {
        at: leasehold::format_rfc3339(std::time::SystemTime::now()),
        how: "forged".into(),
        by: None,
    });
    let stale = crafted(&sc, sc.c(), gone_pid, gone_start, top + 11);
    for (lease, what) in [(released, "released"), (stale, "stale")] {
        forge_lock(&sc, &cs, sc.c(), &lock, &lease);
        // In place: LOCK is C's plain record; both shared jobs alive.
        let l = read_lease(&lock);
        assert!(l.get("mode").is_none_or(|m| m.is_null()), "{l}");
        assert_eq!(l["token"].as_u64(), Some(lease.token));
        assert_eq!(fs::metadata(&lock).unwrap().uid(), sc.w.c.uid);
        alive(&sc, &cs, &["a", "b"], &[&a, &b], &format!("{what}: forged"));
        // Root's status says held, by the shared holders' marks.
        let st = sc.run_within(
            Who::Root,
            0o022,
            &["status", "--json", s(&lock)],
            Duration::from_secs(30),
        );
        let v: serde_json::Value = serde_json::from_str(&st.stdout).unwrap_or_default();
        sc.expect(
            v["state"] == "held",
            &st,
            format!("{what}: root's status with the shared holders' records replaced"),
        );
        root_kept_out(
            &sc,
            &cs,
            &["-n"],
            &lock,
            &format!("x-{what}"),
            "x",
            &format!("a {what} plain record at LOCK"),
        );
        alive(
            &sc,
            &cs,
            &["a", "b"],
            &[&a, &b],
            &format!("{what}: root tried"),
        );
    }
    release(&sc, &cs, a, "a");
    release(&sc, &cs, b, "b");
    match hold(&sc, &cs, Who::Root, &["-w", "20"], &lock, "x", "x", LONG) {
        Ok(p) => release(&sc, &cs, p, "x"),
        Err(o) => sc.expect(false, &o, "root's exclusive run once both released"),
    }
    cs.verify_shared(2);
    sc.finish();
}

/// Member A holds `job.lock` (a plain lock); its wrapper is stopped (a holder that has not
/// noticed anything yet) and member C replaces LOCK with a released record whose token is above
/// A's. Root's `run -n` must not enter beside A's job (before: the token hid A's kernel mark
/// and root entered at once); once A's wrapper is continued it fences (74), and root enters.
#[test]
fn a_released_record_with_a_higher_token_never_hides_a_running_holder() {
    let test = "a_released_record_with_a_higher_token_never_hides_a_running_holder";
    let Some((_p, sc, lock)) = attack_scene(test) else {
        return;
    };
    let cs = shared_cs(&sc);
    let a = hold(&sc, &cs, sc.a(), &[], &lock, "a", "x", LONG)
        .unwrap_or_else(|o| panic!("A could not take job.lock: {}", describe(&o)));
    let top = token(&lock);
    a.signal(Signal::SIGSTOP);
    assert!(harness::wait_until(Duration::from_secs(5), || {
        crate::support::procfs::is_stopped(a.pid())
    }));
    let mut released = crafted(&sc, sc.c(), 1, 0, top + 10);
    released.state = leasehold::LeaseState::Released;
    released.ended = Some(leasehold::Ending {
        at: leasehold::format_rfc3339(std::time::SystemTime::now()),
        how: "forged".into(),
        by: None,
    });
    forge_lock(&sc, &cs, sc.c(), &lock, &released);
    // In place: LOCK is C's released record above A's token; A's job alive, its wrapper stopped.
    let l = read_lease(&lock);
    assert_eq!(l["token"].as_u64(), Some(top + 10));
    assert_eq!(fs::metadata(&lock).unwrap().uid(), sc.w.c.uid);
    alive(&sc, &cs, &["a"], &[&a], "after the forgery");
    root_kept_out(
        &sc,
        &cs,
        &["-n"],
        &lock,
        "r1",
        "x",
        "a released record above A's token",
    );
    alive(&sc, &cs, &["a"], &[&a], "after root's try");
    a.signal(Signal::SIGCONT);
    let mut a = a;
    let o = a.finish(LONG);
    sc.expect(
        o.code == 74,
        &o,
        "A's holder, continued after LOCK was replaced",
    );
    match hold(&sc, &cs, Who::Root, &["-w", "20"], &lock, "r2", "x", LONG) {
        Ok(p) => release(&sc, &cs, p, "r2"),
        Err(o) => sc.expect(false, &o, "root's run -w 20 once A fenced"),
    }
    cs.verify_shared(2);
    sc.finish();
}
