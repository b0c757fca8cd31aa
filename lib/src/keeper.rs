//! The process-wide keeper: two threads, started with the first guard (or earlier, by a
//! contender about to wait: [`warm`]) and shared by every guard of the process (a forked child
//! starts its own).
//!
//! Owns: the list of live guards; the renewer (renews each guard when it is due, one after
//! another, and reads the inotify watch on the guards' records: it sleeps on the watch, an
//! eventfd that wakes it for a new guard, and the time of the next renewal or look; the
//! close of its own renewal's descriptor is read back right after the renewal, so that an idle
//! holder wakes once per heartbeat, not once more for its own write) and the watchdog
//! (declares a guard lost when its deadline passes; it never does I/O, so a renewal stuck in
//! I/O cannot hold it up, and it sleeps on a CLOCK_BOOTTIME timerfd set to the earliest
//! deadline, which counted renewals move without waking it; a suspend counts, so the alarm
//! fires on resume). What a renewal is, and when it counts, is the guard's business
//! ([`Kept`]).
//! Must never: keep a guard past its deadline (a stuck renewal may make others lost early, never
//! late); set the alarm later than a live guard's deadline; wake a thread that need not wake.

use std::sync::{Arc, Mutex, MutexGuard as StdGuard, PoisonError};
use std::time::Duration;

use nix::sys::timerfd::{
    ClockId as TimerClock, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags,
};

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;

use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::time::TimeSpec;

use crate::boottime::BootInstant;

/// A guard as the keeper sees it.
pub(crate) trait Kept: Send + Sync {
    /// Lost or released: the keeper lets go of it.
    fn done(&self) -> bool;
    /// When it is next due for renewal.
    fn next_renew(&self) -> BootInstant;
    /// Its renew deadline, while it is live (neither lost nor released).
    fn live_deadline(&self) -> Option<BootInstant>;
    /// One renewal and the scheduling of the next; true when it counted (the deadline moved).
    fn renew_turn(&self) -> bool;
    /// Its deadline has passed: it is lost.
    fn expire(&self);
    /// Where a change to its record shows on this host: a directory to watch and the name in
    /// it (`Holding::watched`).
    fn watched(&self) -> Option<(PathBuf, OsString)>;
    /// When a look at its record is due, after a change to it was seen.
    fn check_at(&self) -> Option<BootInstant>;
    /// A change to its record was seen: schedule a look (soon, not necessarily now).
    fn request_check(&self);
    /// The look (`Holding::check`): loses the guard when its record is plainly not ours.
    fn check_turn(&self);
}

/// How long the renewer sleeps when it cannot sleep on its descriptors (`ppoll` failing).
const LOOK_AGAIN: Duration = Duration::from_millis(10);

/// What the renewer's inotify reports on a watched directory: the record renamed, removed,
/// created, rewritten or its attributes changed, and the directory itself moved, removed or
/// unmounted (`IN_IGNORED`, `IN_UNMOUNT` and `IN_Q_OVERFLOW` come unasked). Not `IN_MODIFY`,
/// nor opens and reads: a look opens and reads the record, and must not cause another look.
fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// A guard's record, watched.
struct Watch {
    wd: WatchDescriptor,
    name: OsString,
    guard: Arc<dyn Kept>,
}

fn lock<T>(m: &Mutex<T>) -> StdGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `g` into the keeper of this process (starting its threads on first use), due for its
/// first renewal at `renew_at`.
pub(crate) fn keep(g: Arc<dyn Kept>, renew_at: BootInstant) -> std::io::Result<()> {
    let k = keeper()?;
    let mut st = lock(&k.state);
    st.guards.push(g);
    k.arm(&mut st, true);
    // Wake the renewer only if it sleeps past this guard's first renewal; in steady state
    // (one guard after another) it is not woken.
    let wake_renewer = st.renewer.later_than(renew_at);
    drop(st);
    if wake_renewer {
        k.wake_renewer();
    }
    Ok(())
}

/// Starts the keeper's threads ahead of need: called by a contender about to wait, so that the
/// guard it takes after its wake-up does not start them between the wake-up and its lease's
/// first use (two thread starts, measured at ~40–70 µs of a hand-over or a takeover). Best
/// effort: a failure here is met again, and reported, by [`keep`].
pub(crate) fn warm() {
    let _ = keeper();
}

/// Takes `g` off the keeper: no renewal starts after this. The threads are not woken (they find
/// it gone when they next wake), and the alarm is left as it is: it can only be early now, which
/// costs the watchdog one wake-up, and no system call here.
pub(crate) fn forget(g: &Arc<dyn Kept>) {
    if let Ok(k) = keeper() {
        lock(&k.state).guards.retain(|x| !Arc::ptr_eq(x, g));
    }
}

/// The process-wide keeper: every live guard, and the two threads that serve them.
struct Keeper {
    state: Mutex<KeeperState>,
    /// Wakes the renewer from its sleep (a new guard due before it would wake); readable until
    /// the renewer reads it, so a wake-up sent before it sleeps is not lost.
    wake: EventFd,
    /// The watchdog's alarm, always set (under the state lock) to the earliest deadline of a
    /// live guard: renewals move it without waking the watchdog, which therefore wakes only
    /// when a deadline is really reached.
    alarm: TimerFd,
    /// Watches the guards' records' directories (see [`watch_mask`]); the renewer sleeps on it,
    /// reads it, and makes the looks it asks for. `None` if inotify cannot be had: the
    /// renewals alone then notice a record that is gone.
    notify: Option<Inotify>,
}

struct KeeperState {
    guards: Vec<Arc<dyn Kept>>,
    watches: Vec<Watch>,
    renewer: Sleep,
    /// What the alarm is set to (`None`: unset, or unknown).
    armed: Option<BootInstant>,
}

impl Keeper {
    /// Watches `g`'s record, if it has one on this host and is not watched yet (best effort:
    /// without the watch a record that is gone is noticed at the next renewal).
    ///
    /// Called at a guard's first look, which its guard schedules a little after it starts
    /// (`guard::WATCH_AFTER`), not when it starts: a process that ever added an inotify watch
    /// waits for an RCU grace period when it closes the instance — at exit, some 10–20 ms —
    /// which a short `leasehold run L -- true` should not pay.
    fn watch(&self, st: &mut KeeperState, g: &Arc<dyn Kept>) {
        if st.watches.iter().any(|w| Arc::ptr_eq(&w.guard, g)) {
            return;
        }
        let (Some(notify), Some((dir, name))) = (&self.notify, g.watched()) else {
            return;
        };
        if let Ok(wd) = notify.add_watch(&dir, watch_mask()) {
            st.watches.push(Watch {
                wd,
                name,
                guard: Arc::clone(g),
            });
        }
    }

    /// Forgets the watches of guards that are done, and removes a directory's watch when no
    /// guard is left in it.
    fn unwatch_done(&self, st: &mut KeeperState) {
        let before: Vec<WatchDescriptor> = st.watches.iter().map(|w| w.wd).collect();
        st.watches.retain(|w| !w.guard.done());
        if let Some(notify) = &self.notify {
            let mut gone: Vec<WatchDescriptor> = before
                .into_iter()
                .filter(|wd| !st.watches.iter().any(|w| w.wd == *wd))
                .collect();
            gone.dedup();
            for wd in gone {
                let _ = notify.rm_watch(wd);
            }
        }
    }

    /// Reads what inotify reports and asks the guards concerned for a look. `renewed`: the
    /// guard whose renewal has just closed the descriptor it wrote its record through, whose
    /// one `IN_CLOSE_WRITE` (queued by that close, before it returned) is its own and asks for
    /// nothing. Another writer's close of the same file at the same moment may be merged with
    /// ours into one event (inotify merges identical events in a row): that change is then seen
    /// at the next renewal, as without the watch.
    fn seen_changes(&self, st: &KeeperState, renewed: Option<&Arc<dyn Kept>>) {
        let Some(notify) = &self.notify else {
            return;
        };
        let mut own_close = renewed;
        while let Ok(events) = notify.read_events() {
            if events.is_empty() {
                break;
            }
            for ev in events {
                let all = ev.mask.intersects(
                    AddWatchFlags::IN_Q_OVERFLOW
                        | AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_UNMOUNT
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                );
                let overflow = ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW);
                for w in &st.watches {
                    let hit =
                        overflow || (w.wd == ev.wd && (all || ev.name.as_deref() == Some(&w.name)));
                    if hit
                        && !overflow
                        && ev.mask == AddWatchFlags::IN_CLOSE_WRITE
                        && own_close.is_some_and(|g| Arc::ptr_eq(g, &w.guard))
                    {
                        own_close = None;
                        continue;
                    }
                    if hit && !w.guard.done() {
                        w.guard.request_check();
                    }
                }
            }
        }
    }

    /// Wakes the renewer (best effort: a failed write leaves it to wake at its own time, as
    /// late as the next renewal it knew of).
    fn wake_renewer(&self) {
        let _ = self.wake.write(1);
    }

    /// The renewer's sleep, with the state unlocked: until `timeout` has passed (`None`:
    /// forever), the renewer is woken, or inotify has something to report (read here, with the
    /// state locked again, and turned into looks asked for). Returns the state, locked.
    fn sleep(&self, timeout: Option<Duration>) -> StdGuard<'_, KeeperState> {
        // The eventfd, then the watch (without one, the stand-in second entry is not polled).
        let watch = self
            .notify
            .as_ref()
            .map_or(self.wake.as_fd(), |n| n.as_fd());
        let mut fds = [
            PollFd::new(self.wake.as_fd(), PollFlags::POLLIN),
            PollFd::new(watch, PollFlags::POLLIN),
        ];
        let used = if self.notify.is_some() { 2 } else { 1 };
        match ppoll(&mut fds[..used], timeout.map(TimeSpec::from_duration), None) {
            // Interrupted: the loop computes the sleep anew.
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // Never seen; without a sleep here the renewer would spin on it.
            Err(_) => std::thread::sleep(timeout.unwrap_or(Duration::MAX).min(LOOK_AGAIN)),
        }
        let woken = fds[0].revents().is_some_and(|r| !r.is_empty());
        if woken {
            let _ = self.wake.read();
        }
        let st = lock(&self.state);
        self.seen_changes(&st, None);
        st
    }

    /// Sets the alarm for the earliest deadline among the live guards of `st` (the state,
    /// locked), or clears it when there is none.
    ///
    /// `lazy` (a new guard): only ever bring the alarm forward. A later alarm than needed costs
    /// at most one early wake-up of the watchdog, which then sets it exactly; not touching it
    /// saves a system call on the way into every lease.
    fn arm(&self, st: &mut KeeperState, lazy: bool) {
        let earliest = st.guards.iter().filter_map(|g| g.live_deadline()).min();
        let needed = match (lazy, earliest, st.armed) {
            (_, e, armed) if e == armed => false,
            (true, Some(e), Some(armed)) => e < armed,
            (true, None, _) => false,
            _ => true,
        };
        if !needed {
            return;
        }
        let set = match earliest {
            Some(d) => self.alarm.set(
                Expiration::OneShot(d.timespec()),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.alarm.unset(),
        };
        // If setting failed, forget what is armed, so that the next call sets it again.
        st.armed = if set.is_ok() { earliest } else { None };
    }
}

/// What the renewer is doing, so that a new guard wakes it only when it must.
#[derive(Clone, Copy)]
enum Sleep {
    /// Awake: it looks at the guard list again before it sleeps.
    Awake,
    /// Asleep until then.
    Until(BootInstant),
    /// Asleep until woken.
    Forever,
}

impl Sleep {
    /// Whether a thread in this state would wake up too late for something due at `due`.
    fn later_than(self, due: BootInstant) -> bool {
        match self {
            Sleep::Awake => false,
            Sleep::Until(t) => t > due,
            Sleep::Forever => true,
        }
    }
}

/// The keeper of this process, its threads started on first use — and again in a forked child,
/// which inherits the keeper's memory but not its threads.
fn keeper() -> std::io::Result<&'static Keeper> {
    static KEEPER: Mutex<Option<(u32, &'static Keeper)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = lock(&KEEPER);
    if let Some((p, k)) = *slot
        && p == pid
    {
        return Ok(k);
    }
    let k: &'static Keeper = Box::leak(Box::new(Keeper {
        state: Mutex::new(KeeperState {
            guards: Vec::new(),
            watches: Vec::new(),
            renewer: Sleep::Awake,
            armed: None,
        }),
        wake: EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?,
        alarm: TimerFd::new(TimerClock::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC)?,
        notify: Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok(),
    }));
    for (name, body) in [
        ("leasehold-renew", renewer as fn(&'static Keeper)),
        ("leasehold-watch", watchdog as fn(&'static Keeper)),
    ] {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(k))?;
    }
    *slot = Some((pid, k));
    Ok(k)
}

/// Renews every guard when it is due. Renewals run one after another: one stuck in I/O delays
/// the others, whose deadlines the watchdog still keeps (they are then lost, never kept).
fn renewer(k: &'static Keeper) {
    loop {
        let due: Vec<Arc<dyn Kept>> = {
            let mut st = lock(&k.state);
            loop {
                st.guards.retain(|g| !g.done());
                if !st.watches.is_empty() {
                    k.unwatch_done(&mut st);
                }
                let now = BootInstant::now();
                let next = st.guards.iter().map(|g| due_at(g.as_ref())).min();
                match next {
                    Some(n) if n <= now => break,
                    Some(n) => {
                        st.renewer = Sleep::Until(n);
                        drop(st);
                        st = k.sleep(Some(n - now));
                    }
                    None => {
                        st.renewer = Sleep::Forever;
                        drop(st);
                        st = k.sleep(None);
                    }
                }
                st.renewer = Sleep::Awake;
            }
            let now = BootInstant::now();
            st.guards
                .iter()
                .filter(|g| due_at(g.as_ref()) <= now)
                .cloned()
                .collect()
        };
        for g in due {
            let now = BootInstant::now();
            if g.next_renew() <= now {
                let counted = g.renew_turn();
                let mut st = lock(&k.state);
                if counted {
                    k.arm(&mut st, false);
                }
                k.seen_changes(&st, Some(&g));
            } else if g.check_at().is_some_and(|c| c <= now) {
                k.watch(&mut lock(&k.state), &g);
                g.check_turn();
            }
        }
    }
}

/// When the renewer next has something to do for `g`: a renewal, or a look asked for.
fn due_at(g: &dyn Kept) -> BootInstant {
    let renew = g.next_renew();
    g.check_at().map_or(renew, |c| c.min(renew))
}

impl Keeper {
    /// Reads the alarm (blocking until it rings). If it cannot be read, waits 10 ms instead
    /// (the watchdog never stops watching).
    fn ring(&self) {
        if self.alarm.wait().is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Declares guards lost at their deadlines. Never does I/O: it sleeps on its alarm (see
/// [`Keeper::alarm`]), and wakes only when the earliest deadline is reached.
fn watchdog(k: &'static Keeper) {
    loop {
        k.ring();
        let st = lock(&k.state);
        let now = BootInstant::now();
        let expired: Vec<Arc<dyn Kept>> = st
            .guards
            .iter()
            .filter(|g| g.live_deadline().is_some_and(|d| now >= d))
            .cloned()
            .collect();
        drop(st);
        for g in expired {
            g.expire();
        }
        k.arm(&mut lock(&k.state), false);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;

    /// The watchdog's alarm runs on CLOCK_BOOTTIME (clock id 7), so a suspend counts towards a
    /// renew deadline; CLOCK_MONOTONIC (1) would stop while the host sleeps, and a holder would
    /// run on after resuming as if no time had passed while others took the lock over.
    #[test]
    fn watchdog_alarm_counts_time_spent_suspended() {
        let k = keeper().expect("keeper");
        let fd = k.alarm.as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).expect("fdinfo");
        let clock = info
            .lines()
            .find_map(|l| l.strip_prefix("clockid:"))
            .map(str::trim);
        assert_eq!(clock, Some("7"), "timerfd fdinfo: {info}");
    }
}
