//! Clock *rate* skew: a holder whose clock runs 5 % slow or fast relative to a contender's.
//!
//! libfaketime's rate mode cannot reach leasehold (it reads CLOCK_BOOTTIME through the vDSO,
//! and its renewals sleep on kernel timers), and only the rate *between* the two clocks matters:
//! a holder 5 % slow against a contender is a contender 5 % fast against a holder. So the holder
//! here runs on the real clock (a foreign host's, judged only by its heartbeat) and the
//! contender gets a clock whose CLOCK_BOOTTIME runs at `rate` × real time ([`RateClock`],
//! injected with `LeaseBuilder::clock`):
//!
//! - rate 1.05 (the holder 5 % slow) and 0.95 (5 % fast): over 3 TTLs of looks every 10 ms while
//!   the holder renews, the contender never judges the lease anything but held, and the holder's
//!   heartbeat never looks older than a heartbeat (plus scheduling slack) on the contender's
//!   clock;
//! - once the holder stops renewing (SIGSTOP), the contender takes over only after the moment by
//!   which the holder's own fencing has ended its job — its last renewal's start + TTL − margin,
//!   on the holder's clock (PROTOCOL.md §8) — even with the holder 5 % slow. That is what the
//!   margin (`timing.rs`: max(20ms, TTL/20)) buys: with a margin of TTL/50 it fails.
//!
//! The tolerated rate skew (docs/guide.md, "Clocks"; PROTOCOL.md §8, 3): a slow holder is safe while
//! (TTL − margin) × slowness < TTL, i.e. up to margin / (TTL − margin) ≈ 5.2 % with the default
//! margin; a renewing holder never looks stale until its clock runs about 3 × slow (heartbeat
//! TTL/3).

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use leasehold::{Clock, LeaseBuilder, State, SystemClock};
use nix::sys::signal::Signal;

/// A clock whose CLOCK_BOOTTIME runs at `rate` × the real one from the moment it is made (the
/// wall clock is the real one: liveness never reads it).
#[derive(Debug)]
struct RateClock {
    rate: f64,
    base: Duration,
}

impl RateClock {
    fn new(rate: f64) -> RateClock {
        RateClock {
            rate,
            base: SystemClock.boottime(),
        }
    }
}

impl Clock for RateClock {
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
    fn boottime(&self) -> Duration {
        let real = SystemClock.boottime().saturating_sub(self.base);
        self.base + real.mul_f64(self.rate)
    }
}

/// The holder's wall-clock `heartbeat_at` in `lock`'s lease, and its heartbeat sequence.
fn heartbeat(lock: &std::path::Path) -> (SystemTime, u64) {
    let l = support::raw_lease(lock).expect("lease");
    let at = leasehold::parse_rfc3339(l["heartbeat_at"].as_str().expect("heartbeat_at"))
        .expect("RFC 3339");
    (at, l["heartbeat_seq"].as_u64().expect("heartbeat_seq"))
}

/// A renewing foreign holder (TTL 1 s) against a contender whose clock runs at `rate`: never
/// judged stale while it renews; once stopped, taken over only after its fencing deadline.
fn rate_case(name: &str, rate: f64) {
    let dir = support::tempdir();
    let lock = dir.path().join(format!("{name}.lock"));
    let ttl = Duration::from_millis(1000);
    let timing = LeaseBuilder::new(&lock).ttl(ttl).timing().expect("timing");
    let (mut holder, token, _) =
        support::spawn_holder(&lock, ttl, &[("LH_HOST", format!("rate-{name}"))]);
    let clock: Arc<dyn Clock> = Arc::new(RateClock::new(rate));
    let contender = || LeaseBuilder::new(&lock).ttl(ttl).clock(Arc::clone(&clock));

    // While it renews: 3 TTLs of looks, every one refused as held.
    let (_, seq0) = heartbeat(&lock);
    let watch = Instant::now();
    let mut oldest = Duration::ZERO;
    while watch.elapsed() < ttl * 3 {
        match contender().try_acquire() {
            Err(leasehold::Error::WouldBlock { verdict, .. }) => {
                assert_eq!(verdict.state, State::Held, "{name}: {verdict}");
                oldest = oldest.max(verdict.heartbeat_age.unwrap_or_default());
            }
            Ok(g) => panic!(
                "{name}: a renewing holder judged expired after {:?}: {:?}",
                watch.elapsed(),
                g.broke()
            ),
            Err(e) => panic!("{name}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, seq1) = heartbeat(&lock);
    assert!(
        seq1 >= seq0 + 6,
        "{name}: renewals {seq0} -> {seq1} in 3 TTLs"
    );
    // Never older than a heartbeat on the contender's clock, with slack for a loaded machine.
    let bound = timing.heartbeat.mul_f64(rate.max(1.0)) + ttl / 4;
    assert!(
        oldest < bound,
        "{name}: heartbeat seen {oldest:?} old (bound {bound:?})"
    );

    // Stopped: the holder's fencing would have ended its job by its last renewal's start
    // + TTL − margin (holder's clock: the real one here). No takeover before that.
    holder.signal(Signal::SIGSTOP);
    // The contender keeps looking every 2 ms, so that it sees the last renewal (perhaps in
    // flight as the holder stopped) as soon as it is written.
    let started = Instant::now();
    let g = loop {
        match contender().try_acquire() {
            Ok(g) => break g,
            Err(leasehold::Error::WouldBlock { .. }) => {}
            Err(e) => panic!("{name}: {e}"),
        }
        assert!(
            started.elapsed() < ttl * 5,
            "{name}: a stopped holder was never taken over"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let broke = g.broke().expect("broke the stopped holder's lease");
    let judged = broke.judged_at;
    // The last renewal, as the record judged stale says (holder's clock: the real one here).
    let last = broke
        .lease
        .as_ref()
        .expect("the broken lease")
        .heartbeat_at
        .clone();
    let last = leasehold::parse_rfc3339(&last).expect("RFC 3339");
    let deadline = last + ttl - timing.margin;
    assert!(g.token() > token);
    let early = deadline.duration_since(judged).ok();
    eprintln!(
        "rate {rate}: oldest heartbeat seen {oldest:?} while renewing; taken over {} the \
         holder's fencing deadline (margin {:?})",
        match (early, judged.duration_since(deadline)) {
            (Some(e), _) => format!("{e:?} BEFORE"),
            (None, Ok(l)) => format!("{l:?} after"),
            (None, Err(_)) => "at".into(),
        },
        timing.margin
    );
    assert!(
        early.is_none(),
        "{name}: taken over {early:?} before the holder's job was sure to be fenced \
         (its last heartbeat + TTL {ttl:?} − margin {:?}): a holder whose clock runs at \
         1/{rate} of the contender's would still run its job",
        timing.margin
    );
    g.release().expect("release");
    holder.kill();
}

#[test]
fn a_holder_whose_clock_runs_5_percent_slow_is_never_judged_expired_while_it_renews_nor_taken_over_before_its_fencing_deadline()
 {
    rate_case("slow", 1.05);
}

#[test]
fn a_holder_whose_clock_runs_5_percent_fast_is_never_judged_expired_while_it_renews_nor_taken_over_before_its_fencing_deadline()
 {
    rate_case("fast", 0.95);
}
