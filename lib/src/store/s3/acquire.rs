//! Taking a lease on S3: the lock's object as a [`Store`], driven by the shared acquisition
//! loop (`acquire.rs`) that drives lock files.
//!
//! Owns: what the loop asks of a store, for one object — the probe that the server honours
//! conditions (at the first section); the section, which on S3 is a compare-and-swap rather
//! than an exclusion: [`Store::current`] reads the object (record and ETag) and
//! [`Store::take`] writes our lease with `If-None-Match: *` (no object) or `If-Match: ETAG` (the
//! object read), the token one above the one read, so that a take lands only on exactly what
//! was judged, and a refused write (412/404) is a lost race ([`Took::Raced`]: the loop reads
//! again); a write with an unknown outcome (5xx, 409, no answer) is settled by the next read,
//! where our lease, held, means it landed ([`Store::landed`]); the wait between looks (every
//! heartbeat, at most 1 s; cancellable). Judging, taking over (a same-host holder by its
//! processes, any other by this process's own observation of its heartbeat on
//! CLOCK_BOOTTIME), endings and the wait lines are the loop's, as for files.
//! Must never: write without a condition; retry a write before reading; trust the server's
//! clock; loop on a server that refuses `If-Match` with the ETag it reports.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::holding::S3Holding;
use super::{CALL_TIMEOUT, Client, Cond, Put, encode};
use crate::boottime::BootInstant;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::fsio::LockContent;
use crate::judge::Judge;
use crate::record::{Lease, LeaseState};
use crate::store::{Binding, Joiner, Store, StuckPolicy, Took};
use crate::verdict::{Verdict, Waiting};

/// The lock's object, as the shared loop sees a store.
pub(crate) struct S3Store {
    client: Arc<Client>,
    /// How often a waiter looks again (the heartbeat, 50 ms to 1 s), and the renewal period
    /// of a lease taken here.
    heartbeat: Duration,
    /// Whether the server was seen to honour conditional writes.
    probed: AtomicBool,
    /// The last lease we wrote whose answer we did not get: its record, exact bytes and when
    /// the write began.
    tried: Mutex<Option<(Lease, Vec<u8>, BootInstant)>>,
    /// Takes in a row refused on the ETag the object still had (a server that cannot compare
    /// ETags).
    stuck: AtomicU32,
    /// Not a lock's object at all: the place a holder of a shared lock would have, which S3
    /// locks do not have (`--shared` and `--slots` are refused on them); reads as missing.
    slot: bool,
}

/// A section on S3: what the last read found, for the take's condition.
pub(crate) struct S3Section {
    /// The object's ETag as [`Store::current`] read it (`None`: no object).
    etag: RefCell<Option<String>>,
    /// How long one request may take: [`CALL_TIMEOUT`], no longer than the caller's deadline
    /// leaves (at least 2 s: a one-shot caller's deadline is short, a slow gateway is not gone).
    limit: Duration,
}

/// What wakes a waiter on S3: time (nothing is notified), or its cancel.
pub(crate) struct S3Waker {
    cancel: Option<Cancel>,
}

impl S3Store {
    pub(crate) fn new(client: Client, heartbeat: Duration) -> S3Store {
        S3Store {
            client: Arc::new(client),
            heartbeat,
            probed: AtomicBool::new(false),
            tried: Mutex::new(None),
            stuck: AtomicU32::new(0),
            slot: false,
        }
    }

    fn holding(&self, etag: String) -> S3Holding {
        S3Holding::new(Arc::clone(&self.client), etag, self.heartbeat)
    }

    fn poll(&self) -> Duration {
        self.heartbeat
            .clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    /// A take refused although the object still has the ETag it was conditioned on (in both
    /// forms, see `Client::put_key`): a server that cannot compare ETags; never loop on it.
    fn refused_on_its_own_etag(&self, etag: &str, limit: Duration) -> Result<()> {
        let same = matches!(self.client.get(limit),
            Ok(super::Got::Object { etag: now, .. }) if now == etag);
        if !same {
            self.stuck.store(0, Relaxed);
            return Ok(());
        }
        if self.stuck.fetch_add(1, Relaxed) + 1 < 3 {
            return Ok(());
        }
        Err(Error::UnsafeFileSystem {
            path: self.client.lock.url.clone(),
            why: "the S3 server refuses If-Match with the very ETag it reports for the object \
                  (quoted or not): it cannot be used for locks"
                .into(),
        })
    }
}

/// How long one call may take before `deadline` (see [`S3Section::limit`]).
fn call_limit(deadline: Option<Instant>) -> Duration {
    deadline.map_or(CALL_TIMEOUT, |d| {
        let left = d.saturating_duration_since(Instant::now());
        CALL_TIMEOUT.min(left).max(Duration::from_secs(2))
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for S3Store {
    type Kept = ();
    type Section = S3Section;
    type Place = ();
    type Ahead = ();
    type Waker = S3Waker;
    type Holding = S3Holding;

    fn binding(&self) -> &dyn Binding {
        &self.client.lock
    }

    fn holder(&self, _k: u32) -> Self {
        S3Store {
            client: Arc::clone(&self.client),
            heartbeat: self.heartbeat,
            probed: AtomicBool::new(true),
            tried: Mutex::new(None),
            stuck: AtomicU32::new(0),
            slot: true,
        }
    }

    fn judge<'a>(
        &'a self,
        me: &'a crate::identity::Identity,
        clock: &'a dyn crate::clock::Clock,
    ) -> Judge<'a> {
        Judge {
            binding: self.binding(),
            me,
            clock,
            wall_skew: None,
            // Observations of a foreign heartbeat live in this process's memory.
            persist: false,
        }
    }

    fn read(&self) -> Result<LockContent> {
        if self.slot {
            return Ok(LockContent::Missing);
        }
        Ok(self.client.read(CALL_TIMEOUT)?.0)
    }

    fn enter(
        &self,
        _kept: &mut (),
        deadline: Option<Instant>,
        _stuck_after: Duration,
        _policy: StuckPolicy,
        _place: Option<&mut ()>,
        _blocked: Option<&mut dyn FnMut(&str)>,
    ) -> Result<S3Section> {
        let limit = call_limit(deadline);
        if !self.probed.load(Relaxed) {
            self.client.probe(limit)?;
            self.probed.store(true, Relaxed);
        }
        Ok(S3Section {
            etag: RefCell::new(None),
            limit,
        })
    }

    fn leave(&self, _section: S3Section, _kept: &mut ()) {}

    fn current(&self, section: &S3Section, _place: &mut ()) -> Result<LockContent> {
        if self.slot {
            return Ok(LockContent::Missing);
        }
        let (content, etag, _) = self.client.read(section.limit)?;
        *section.etag.borrow_mut() = etag;
        Ok(content)
    }

    fn landed(&self, section: &S3Section, content: &LockContent) -> Option<Took<S3Holding>> {
        let mut tried = lock(&self.tried);
        let ours = matches!((content, tried.as_ref()), (LockContent::Lease(l, _), Some((t, _, _)))
            if l.lease_id == t.lease_id && l.state == LeaseState::Held);
        let etag = section.etag.borrow().clone().filter(|_| ours)?;
        let (lease, bytes, sent) = tried.take()?;
        Some(Took::Ours(lease, bytes, sent, self.holding(etag)))
    }

    fn ahead(
        &self,
        _section: &S3Section,
        _place: Option<&mut ()>,
        _ttl: Duration,
    ) -> Result<(Option<()>, usize)> {
        // No line on S3: contenders look in turn, and whoever's write lands first holds.
        Ok((None, 0))
    }

    fn describe(&self, _ahead: &()) -> String {
        String::new()
    }

    fn polls(&self) -> bool {
        true
    }

    fn join(
        &self,
        _section: &S3Section,
        _place: &mut (),
        _token: u64,
        _first: bool,
        _who: Joiner<'_>,
    ) -> Result<()> {
        Ok(())
    }

    fn prepare(&self, _place: &mut (), _lease: &[u8]) {}

    fn take(
        &self,
        section: S3Section,
        _place: (),
        prev_token: u64,
        lease: &mut dyn FnMut(u64) -> (Lease, Vec<u8>),
    ) -> Result<Took<S3Holding>> {
        let (lease, record) = lease(prev_token.saturating_add(1));
        let (body, _) = encode(&record);
        let etag = section.etag.into_inner();
        let cond = match &etag {
            None => Cond::Absent,
            Some(e) => Cond::Match(e.clone()),
        };
        // The renew deadline counts from before the write that makes the lease visible.
        let sent = BootInstant::now();
        *lock(&self.tried) = Some((lease.clone(), record.clone(), sent));
        match self.client.put(&body, &cond, section.limit)? {
            Put::Done(e) => {
                *lock(&self.tried) = None;
                self.stuck.store(0, Relaxed);
                Ok(Took::Ours(lease, record, sent, self.holding(e)))
            }
            Put::Failed => {
                if let Some(e) = &etag {
                    self.refused_on_its_own_etag(e, section.limit)?;
                }
                Ok(Took::Raced)
            }
            // Perhaps written: the next read settles it (`landed`).
            Put::Unknown(_) => Ok(Took::Raced),
        }
    }

    fn replace(&self, section: &S3Section, lease: &Lease) -> Result<()> {
        let (body, _) = encode(&lease.to_bytes());
        let cond = match section.etag.borrow().clone() {
            None => Cond::Absent,
            Some(e) => Cond::Match(e),
        };
        match self.client.put(&body, &cond, section.limit)? {
            Put::Done(_) => Ok(()),
            Put::Failed | Put::Unknown(_) => Err(Error::Refused {
                path: self.client.lock.url.clone(),
                why: "the lock's object changed while it was being replaced; try again".into(),
            }),
        }
    }

    fn clean_after_crash(&self) {}

    fn waker(&self, _poll: bool, _ttl: Duration, cancel: Option<Cancel>) -> S3Waker {
        S3Waker { cancel }
    }

    fn wait(
        &self,
        waker: &mut S3Waker,
        _place: &mut (),
        _ahead: Option<&()>,
        _seen: &Verdict,
        deadline: Option<Instant>,
    ) {
        let poll = self.poll();
        let left = deadline.map_or(poll, |d| d.saturating_duration_since(Instant::now()));
        crate::cancel::nap(waker.cancel.as_ref(), poll.min(left));
    }

    fn waiting(&self) -> Vec<Waiting> {
        Vec::new()
    }
}

/// Takes the lease on the S3 lock the builder names, through the shared loop: at once or not at
/// all (`one_shot`), or waiting until `deadline` (for ever with `None`).
pub(crate) fn acquire(
    s: &crate::builder::LeaseBuilder,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Result<crate::guard::LeaseGuard> {
    if s.want != crate::slots::Want::Exclusive {
        return Err(Error::Settings(format!(
            "{}: --shared and --slots are not supported on S3 locks yet",
            s.path.display()
        )));
    }
    let timing = s.timing()?;
    let client = Client::new(super::S3Lock::parse(&s.path)?);
    crate::acquire::through(
        s,
        S3Store::new(client, timing.heartbeat),
        deadline,
        one_shot,
    )
}
