//! Taking a lease on S3: the lock's object as a [`Store`], driven by the shared acquisition
//! loop (`acquire.rs`) that drives lock files.
//!
//! Owns: what the loop asks of a store, for one object — the probe that the server honours
//! conditions (at the first section); the section, which on S3 is a compare-and-swap rather
//! than an exclusion: [`Store::current`] reads the object (record and ETag) and
//! [`Store::take`] writes our lease with `If-None-Match: *` (no object) or `If-Match: ETAG` (the
//! object read), the token one above the one read, so that a take lands only on exactly what
//! was judged, and a refused write (412/404) is a lost race ([`Error::Raced`]: the loop reads
//! again); a write with an unknown outcome (5xx, 409, no answer) is settled by the next read,
//! where our lease, held, means it landed ([`Store::landed`]); the wait between looks (every
//! heartbeat, at most 1 s; cancellable). Judging, taking over (a same-host holder by its
//! processes, any other by this process's own observation of its heartbeat on
//! CLOCK_BOOTTIME), endings and the wait lines are the loop's, as for files. For `--shared` and
//! `--slots N` the object also holds every holder's record ([`super::Object`]), and
//! [`Store::holder`] is a view of holder K's entry: the section keeps the object as it read it
//! (`current`), and every write in the section — a stale holder freed, LOCK's shared record,
//! a holder's take — replaces one entry of that object on its ETag, so that all the section's
//! decisions rest on one version of the lock or none of its writes lands
//! ([`Error::Raced`]: the loop reads again).
//! Must never: write without a condition; retry a write before reading; trust the server's
//! clock; loop on a server that refuses `If-Match` with the ETag it reports.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::holding::S3Holding;
use super::{CALL_TIMEOUT, Client, Object, Put};
use crate::boottime::BootInstant;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::fsio::LockContent;
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
    /// the write began (shared with the holders' views: a take may be a holder's).
    tried: Arc<Mutex<Option<Tried>>>,
    /// The object as the current section read it, shared with the holders' views: a holder's
    /// record is read from it, so that what a section decides about the holders rests on the
    /// very version of the object its writes are conditioned on (a fresh read of a holder
    /// beside an older read of LOCK once made a contender see a slot held under a plain LOCK and
    /// refuse its setting as a mismatch). `None`: no section yet; a holder is read afresh.
    seen: Arc<Mutex<Option<Object>>>,
    /// Takes in a row refused on the ETag the object still had (a server that cannot compare
    /// ETags).
    stuck: AtomicU32,
    /// Which record of the object this store reads and writes: 0, LOCK's; K + 1, holder K's
    /// of a shared or counted lock.
    entry: usize,
}

/// A take whose answer we did not get: the lease, its exact bytes, when the write began.
type Tried = (Lease, Vec<u8>, BootInstant);

/// A section on S3: the object as the section read it, for the writes' conditions.
pub(crate) struct S3Section {
    /// The object as [`Store::current`] read it, then as the section's own writes left it.
    snap: RefCell<Object>,
    /// Whether [`Store::current`] has read it yet.
    read: std::cell::Cell<bool>,
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
            tried: Arc::new(Mutex::new(None)),
            seen: Arc::new(Mutex::new(None)),
            stuck: AtomicU32::new(0),
            entry: 0,
        }
    }

    /// Our lease in entry `entry` of `object` (as we wrote it).
    fn holding(&self, entry: usize, object: Object) -> S3Holding {
        S3Holding::new(Arc::clone(&self.client), entry, object, self.heartbeat)
    }

    /// A section on `object`, read already (by `status` or a break, before it knew the lock
    /// was shared): its holders are read from it too.
    pub(crate) fn section_on(&self, object: Object) -> S3Section {
        *lock(&self.seen) = Some(object.clone());
        S3Section {
            snap: RefCell::new(object),
            read: std::cell::Cell::new(true),
            limit: CALL_TIMEOUT,
        }
    }

    fn raced(&self) -> Error {
        Error::Raced {
            path: self.client.lock.url.clone(),
        }
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

    fn holder(&self, k: u32) -> Self {
        S3Store {
            client: Arc::clone(&self.client),
            heartbeat: self.heartbeat,
            probed: AtomicBool::new(true),
            tried: Arc::clone(&self.tried),
            seen: Arc::clone(&self.seen),
            stuck: AtomicU32::new(0),
            entry: k as usize + 1,
        }
    }

    fn read(&self) -> Result<LockContent> {
        let url = &self.client.lock.url;
        if self.entry > 0
            && let Some(o) = lock(&self.seen).as_ref()
        {
            return o.content(url, self.entry);
        }
        self.client.object(CALL_TIMEOUT)?.content(url, self.entry)
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
            snap: RefCell::new(Object::default()),
            read: std::cell::Cell::new(false),
            limit,
        })
    }

    fn leave(&self, _section: S3Section, _kept: &mut ()) {}

    fn current(&self, section: &S3Section, _place: &mut ()) -> Result<LockContent> {
        let object = self.client.object(section.limit)?;
        let content = object.content(&self.client.lock.url, self.entry)?;
        // The section's writes are conditioned on the object its decisions were made on: the
        // first read; a second look (`released_since`, before a takeover) replaces it only when
        // it shows the lease released since, which is then what is taken.
        let again = section.read.replace(true);
        let released =
            matches!(&content, LockContent::Lease(l, _) if l.state == LeaseState::Released);
        if !again || released {
            *lock(&self.seen) = Some(object.clone());
            *section.snap.borrow_mut() = object;
        }
        Ok(content)
    }

    fn landed(&self, section: &S3Section, _content: &LockContent) -> Option<Took<S3Holding>> {
        let mut tried = lock(&self.tried);
        let id = tried.as_ref()?.0.lease_id.clone();
        let snap = section.snap.borrow();
        // Our lease, held, in whichever record we tried to take (LOCK's or a holder's).
        let entry = (0..snap.entries.len()).find(|i| {
            matches!(snap.content(&self.client.lock.url, *i),
                Ok(LockContent::Lease(l, _)) if l.lease_id == id && l.state == LeaseState::Held)
        })?;
        let (lease, bytes, sent) = tried.take()?;
        Some((lease, bytes, sent, self.holding(entry, snap.clone())))
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
        let mut snap = section.snap.into_inner();
        let (body, nonce) = snap.with(self.entry, &record);
        // The renew deadline counts from before the write that makes the lease visible.
        let sent = BootInstant::now();
        *lock(&self.tried) = Some((lease.clone(), record.clone(), sent));
        match self.client.put(&body, &snap.cond(), section.limit)? {
            Put::Done(e) => {
                *lock(&self.tried) = None;
                self.stuck.store(0, Relaxed);
                snap.wrote(self.entry, &record, e, nonce);
                Ok((lease, record, sent, self.holding(self.entry, snap)))
            }
            Put::Failed => {
                if let Some(e) = &snap.etag {
                    self.refused_on_its_own_etag(e, section.limit)?;
                }
                Err(self.raced())
            }
            // Perhaps written: the next read settles it (`landed`).
            Put::Unknown(_) => Err(self.raced()),
        }
    }

    fn replace(&self, section: &S3Section, lease: &Lease) -> Result<()> {
        let record = lease.to_bytes();
        let mut snap = section.snap.borrow_mut();
        let (body, nonce) = snap.with(self.entry, &record);
        match self.client.put(&body, &snap.cond(), section.limit)? {
            Put::Done(e) => {
                snap.wrote(self.entry, &record, e, nonce);
                Ok(())
            }
            // Changed since the section read it, or perhaps written: read again either way (a
            // write of ours that landed freed or marked what the section had judged so).
            Put::Failed | Put::Unknown(_) => Err(self.raced()),
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
    let timing = s.timing()?;
    let client = Client::new(super::S3Lock::parse(&s.path)?);
    crate::acquire::through(
        s,
        S3Store::new(client, timing.heartbeat),
        deadline,
        one_shot,
    )
}
