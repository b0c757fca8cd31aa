//! The lease record: what LOCK contains, byte for byte.
//!
//! Owns: the versioned JSON format, its fixed-width mutable header (state, heartbeat sequence,
//! heartbeat time) that renewals rewrite in place without new blocks, the checksum that makes a
//! torn read detectable, and validation of everything read. Must never: accept a record whose
//! checksum does not match, misread a newer format version, or panic on any input.

use serde::{Deserialize, Serialize};

use crate::clock::RFC3339_WIDTH;
use crate::ending::{Ack, History, LastEnding};

/// The highest format version this build reads and writes: 2, a lock used with `--shared` or
/// `--slots` (a record carrying a [`Mode`]); a plain lock's records stay version 1.
pub const FORMAT_VERSION: u64 = 2;
/// The format version of a plain (exclusive-only) lock's records, and of holder files.
pub const PLAIN_FORMAT_VERSION: u64 = 1;
/// A lease file larger than this is not a lease.
pub const MAX_LEASE_BYTES: u64 = 64 * 1024;

const P_CHECKSUM: &str = "{\n  \"leasehold\": 1,\n  \"checksum\": \"";
/// The same prefix for format 2 (same length: every offset below holds for both).
const P_CHECKSUM_2: &str = "{\n  \"leasehold\": 2,\n  \"checksum\": \"";
const CHECKSUM_W: usize = 16;
const P_STATE: &str = "\",\n  \"state\": ";
const STATE_W: usize = 10; // "\"released\"" is 10 bytes; "\"held\"" and "\"revoked\"" are padded
const P_SEQ: &str = ",\n  \"heartbeat_seq\": ";
const SEQ_W: usize = 20;
const P_AT: &str = ",\n  \"heartbeat_at\": \"";
const P_END: &str = "\",\n";
/// The token field of the body (top level: two spaces of indent; a string value cannot contain
/// a raw newline, so this never matches inside one).
const P_TOKEN: &str = "\n  \"token\": ";
const TOKEN_W: usize = 20;
const P_ACQUIRED: &str = "\n  \"acquired_at\": \"";

const OFF_CHECKSUM: usize = P_CHECKSUM.len();
const OFF_STATE: usize = OFF_CHECKSUM + CHECKSUM_W + P_STATE.len();
const OFF_SEQ: usize = OFF_STATE + STATE_W + P_SEQ.len();
const OFF_AT: usize = OFF_SEQ + SEQ_W + P_AT.len();
const OFF_BODY: usize = OFF_AT + RFC3339_WIDTH + P_END.len();

/// Byte range of the header that a renewal rewrites in place (checksum .. heartbeat time).
pub(crate) const MUTABLE_RANGE: std::ops::Range<usize> = OFF_CHECKSUM..OFF_AT + RFC3339_WIDTH;

/// Whether a lease is held, revoked, or has been given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// Someone holds it (or held it and died: judging decides).
    Held,
    /// Broken while its holder may still live (a live lease broken by force or by its lease id):
    /// its holder fences at its next renewal, but the lock is not free until its processes are
    /// gone (same host) or this record stayed unchanged for its TTL (other hosts).
    Revoked,
    /// Its holder released it, or someone broke it.
    Released,
}

impl LeaseState {
    fn field(self) -> &'static str {
        match self {
            LeaseState::Held => "\"held\"    ",
            LeaseState::Revoked => "\"revoked\" ",
            LeaseState::Released => "\"released\"",
        }
    }
}

/// Who holds (or held) a lease. Every field is written by the holder about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// PID of the holding process (the `leasehold run` wrapper, or the library user).
    pub pid: i32,
    /// Its start time, in clock ticks after boot (/proc/PID/stat field 22): tells PID reuse apart.
    pub pid_start: u64,
    /// PID of the wrapped command, once it is known.
    #[serde(default)]
    pub child_pid: Option<i32>,
    /// Start time of the wrapped command.
    #[serde(default)]
    pub child_start: Option<u64>,
    /// Process group the wrapped command runs in.
    #[serde(default)]
    pub pgid: Option<i32>,
    /// Host name.
    pub host: String,
    /// Boot id of the host.
    pub boot_id: String,
    /// Inode of the holder's pid namespace.
    pub pid_ns: u64,
    /// Real uid of the holder.
    pub uid: u32,
    /// User name of the holder.
    pub user: String,
    /// The command line being guarded (argv).
    #[serde(default)]
    pub command: Vec<String>,
    /// Free text from the holder (`--note`).
    #[serde(default)]
    pub note: Option<String>,
    /// Script mode (`leasehold lock`): `pid` is a *keeper* holding the lease on behalf of
    /// `child_pid` (the script), which it did not start and whose initial environment carries no
    /// `LEASEHOLD_*` variables. Written only when true, so every other record keeps the exact
    /// bytes of format 1; a reader that does not know the field ignores it and still judges the
    /// record safely (see PROTOCOL.md §2). See [`crate::LeaseBuilder::on_behalf_of`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_behalf: bool,
}

impl Holder {
    /// `user@host pid N (command)`, for one-line messages: safe to show on a terminal, with
    /// user and host escaped ([`crate::text::escape`]) and the command shell-quoted
    /// ([`crate::text::quote_argv`]: `sh -c 'a; b'`), cut to 60 characters.
    pub fn describe(&self) -> String {
        // A stand-in for a holder that wrote no record (an `etcdctl lock` holder): its note
        // says what it is.
        if self.pid == 0
            && self.host.is_empty()
            && let Some(n) = &self.note
        {
            return crate::text::escape(n).into_owned();
        }
        let mut s = format!(
            "{}@{} pid {}",
            crate::text::escape(&self.user),
            crate::text::escape(&self.host),
            self.pid
        );
        if let (true, Some(c)) = (self.on_behalf, self.child_pid) {
            // Script mode: `pid` is the keeper; the script is the one to name.
            s = format!(
                "{}@{} script pid {c} (keeper pid {})",
                crate::text::escape(&self.user),
                crate::text::escape(&self.host),
                self.pid
            );
        }
        if !self.command.is_empty() {
            let mut cmd = crate::text::quote_argv(&self.command);
            if cmd.chars().count() > 60 {
                cmd = cmd.chars().take(57).collect::<String>() + "...";
            }
            s.push_str(&format!(" ({cmd})"));
        }
        s
    }
}

/// How a lease ended: written into a released record (and into a revoked one: who revoked it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ending {
    /// When (holder's wall clock, RFC 3339).
    pub at: String,
    /// What happened, e.g. `exit 0`, `signal 9`, `fenced: lease taken`, `broken: process gone`.
    pub how: String,
    /// Who ended it when it was not the holder: `user@host pid N`.
    #[serde(default)]
    pub by: Option<String>,
}

/// How a shared or counted lock admits its holders: recorded in LOCK (format 2) by every holder
/// of a lock used with `--shared` or `--slots N`, so that every contender sees the lock's one
/// setting (PROTOCOL.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mode {
    /// At most this many holders at once (`--slots N`, a counting semaphore); `None`: any
    /// number of shared holders at once, and an exclusive holder excludes them all
    /// (`--shared`).
    pub slots: Option<u32>,
    /// How many holder files (`.NAME.leasehold-slot-K`, K below it) may hold a lease: every
    /// contender reads them all. Grows as more holders come together; never above `slots`.
    pub width: u32,
}

/// The most holder files a shared lock may have (and so the most holders at once).
pub const MAX_WIDTH: u32 = 4096;

impl Mode {
    /// The setting as the command line spells it: `--shared` or `--slots N`.
    pub fn setting(&self) -> String {
        match self.slots {
            None => "--shared".into(),
            Some(n) => format!("--slots {n}"),
        }
    }
}

/// One lease record, as read from or written to LOCK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Held, revoked or released.
    pub state: LeaseState,
    /// Incremented by every renewal; observers judge liveness by whether it moves.
    pub heartbeat_seq: u64,
    /// Holder's wall clock at the last renewal (RFC 3339, shown, never trusted).
    pub heartbeat_at: String,
    /// Random 128-bit id of this holding, 32 hex digits.
    pub lease_id: String,
    /// Fencing token: strictly increasing per LOCK.
    pub token: u64,
    /// The holder's time-to-live, in milliseconds.
    pub ttl_ms: u64,
    /// Holder's wall clock when it acquired.
    pub acquired_at: String,
    /// Who.
    pub holder: Holder,
    /// How it ended, for released records.
    pub ended: Option<Ending>,
    /// In LOCK of a shared or counted lock: its setting and width (the record is then format
    /// 2). `None` for a plain lock (format 1) and in holder files.
    pub mode: Option<Mode>,
    /// What the record carries forward beyond its own holding: how the holding before it ended,
    /// the last start, its `--max-time` deadline, an acknowledgement (`ending.rs`; all
    /// optional fields a format-1 reader ignores).
    pub history: History,
    /// True when the checksum never matched (a record damaged, e.g. by a crash of the machine
    /// mid-write); such a record is only ever judged by observation, never by its content.
    pub damaged: bool,
}

/// The record's body as written: borrowed from the [`Lease`], so that writing a record copies
/// no string (a record is written on the path of every take and release).
#[derive(Serialize)]
struct Body<'a> {
    lease_id: &'a str,
    token: u64,
    ttl_ms: u64,
    acquired_at: &'a str,
    holder: &'a Holder,
    ended: &'a Option<Ending>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<Mode>,
    #[serde(skip_serializing_if = "is_none")]
    deadline: &'a Option<String>,
    #[serde(skip_serializing_if = "is_none")]
    last_start: &'a Option<String>,
    #[serde(skip_serializing_if = "is_none")]
    last: &'a Option<LastEnding>,
    #[serde(skip_serializing_if = "is_none")]
    acked: &'a Option<Ack>,
}

fn is_none<T>(o: &&Option<T>) -> bool {
    o.is_none()
}

/// The whole record as read. Flat rather than `#[serde(flatten)]` over [`Body`]: flattening
/// buffers every field first, and parsing is on the path of every handoff.
#[derive(Deserialize)]
struct Wire {
    leasehold: u64,
    #[allow(dead_code)]
    checksum: String,
    state: LeaseState,
    heartbeat_seq: u64,
    heartbeat_at: String,
    lease_id: String,
    token: u64,
    ttl_ms: u64,
    acquired_at: String,
    holder: Holder,
    #[serde(default)]
    ended: Option<Ending>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    deadline: Option<String>,
    #[serde(default)]
    last_start: Option<String>,
    #[serde(default)]
    last: Option<LastEnding>,
    #[serde(default)]
    acked: Option<Ack>,
}

/// What a read of LOCK's bytes gave.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Zero bytes or only white space: a free lock (e.g. made by `touch`).
    Empty,
    /// A valid lease.
    Lease(Box<Lease>),
    /// Our format, but the checksum did not match: read again.
    Torn,
    /// A newer format version.
    Newer(u64),
    /// Something else; the string says what.
    NotALease(String),
}

/// A 64-bit checksum (FNV-1a, then a murmur3 finaliser) of the record with the checksum digits
/// taken as zeros. It detects torn reads; it is not a defence against forgery.
fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        h
    }
    // FNV-1a over the bytes with the checksum's own field read as zeros, in three runs rather
    // than a test per byte.
    let lo = OFF_CHECKSUM.min(bytes.len());
    let hi = (OFF_CHECKSUM + CHECKSUM_W).min(bytes.len());
    let mut h = fnv(0xcbf2_9ce4_8422_2325, &bytes[..lo]);
    for _ in lo..hi {
        h ^= u64::from(b'0');
        h = h.wrapping_mul(PRIME);
    }
    h = fnv(h, &bytes[hi..]);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A stable fingerprint of arbitrary bytes (for observing damaged records).
pub(crate) fn fingerprint(bytes: &[u8]) -> u64 {
    checksum(bytes)
}

fn valid_text(s: &str, max: usize) -> bool {
    s.len() <= max
}

impl Lease {
    /// Serialises the record. The result always has the fixed header layout.
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = Body {
            lease_id: &self.lease_id,
            token: self.token,
            ttl_ms: self.ttl_ms,
            acquired_at: &self.acquired_at,
            holder: &self.holder,
            ended: &self.ended,
            mode: self.mode,
            deadline: &self.history.deadline,
            last_start: &self.history.last_start,
            last: &self.history.last,
            acked: &self.history.acked,
        };
        // The fixed header (the checksum zeroed until `seal`), then the body serialised right
        // after it: one buffer, no copy of the body.
        let mut bytes = Vec::with_capacity(1024);
        bytes.extend_from_slice(
            match self.mode {
                None => P_CHECKSUM,
                Some(_) => P_CHECKSUM_2,
            }
            .as_bytes(),
        );
        bytes.extend_from_slice(&[b'0'; CHECKSUM_W]);
        bytes.extend_from_slice(P_STATE.as_bytes());
        bytes.extend_from_slice(self.state.field().as_bytes());
        bytes.extend_from_slice(P_SEQ.as_bytes());
        push_right_aligned(&mut bytes, self.heartbeat_seq, SEQ_W);
        bytes.extend_from_slice(P_AT.as_bytes());
        push_fixed_time(&mut bytes, &self.heartbeat_at);
        bytes.extend_from_slice(P_END.as_bytes());
        let at = bytes.len();
        // Serialising plain structs of strings and integers into memory cannot fail.
        if serde_json::to_writer_pretty(&mut bytes, &body).is_err() {
            bytes.truncate(at);
            bytes.extend_from_slice(b"{\n}");
        }
        // The body's opening "{\n" is the header's: the header already opened the object.
        bytes.drain(at..at + 2);
        // The token right-aligned in 20 columns (JSON allows the spaces), so that a record
        // prepared ahead of time can have its token filled in place (see [`Draft`]): the
        // body's first top-level token field (a string value cannot hold a raw newline, so
        // none matches inside one), written by serde as its plain digits.
        if let Some(start) = find(&bytes[at..], P_TOKEN.as_bytes()).map(|i| at + i + P_TOKEN.len())
            && let Some(len) = bytes[start..].iter().position(|&b| b == b',')
        {
            let mut token = Vec::with_capacity(TOKEN_W);
            push_right_aligned(&mut token, self.token, TOKEN_W);
            bytes.splice(start..start + len, token);
        }
        bytes.push(b'\n');
        seal(&mut bytes);
        bytes
    }

    /// Rewrites the mutable header of `bytes` (a record produced by [`Lease::to_bytes`]) for a
    /// renewal or an in-place release, and returns the bytes to write at
    /// [`MUTABLE_RANGE`]`.start`. The length of the record never changes.
    pub(crate) fn rewrite_header<'b>(
        bytes: &'b mut [u8],
        state: LeaseState,
        seq: u64,
        at: &str,
    ) -> Option<&'b [u8]> {
        if bytes.len() < OFF_BODY {
            return None;
        }
        bytes[OFF_STATE..OFF_STATE + STATE_W].copy_from_slice(state.field().as_bytes());
        bytes[OFF_SEQ..OFF_SEQ + SEQ_W].copy_from_slice(format!("{seq:>SEQ_W$}").as_bytes());
        bytes[OFF_AT..OFF_AT + RFC3339_WIDTH].copy_from_slice(fixed_time(at).as_bytes());
        seal(bytes);
        Some(&bytes[MUTABLE_RANGE])
    }

    /// Parses LOCK's bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Parsed {
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Parsed::Empty;
        }
        if bytes.len() as u64 > MAX_LEASE_BYTES {
            return Parsed::NotALease(format!("{} bytes, larger than any lease", bytes.len()));
        }
        if !bytes.starts_with(P_CHECKSUM.as_bytes()) && !bytes.starts_with(P_CHECKSUM_2.as_bytes())
        {
            return classify_foreign(bytes);
        }
        let fixed_ok = bytes.len() > OFF_BODY
            && &bytes[OFF_CHECKSUM + CHECKSUM_W..OFF_STATE] == P_STATE.as_bytes()
            && &bytes[OFF_STATE + STATE_W..OFF_SEQ] == P_SEQ.as_bytes()
            && &bytes[OFF_SEQ + SEQ_W..OFF_AT] == P_AT.as_bytes()
            && &bytes[OFF_AT + RFC3339_WIDTH..OFF_BODY] == P_END.as_bytes();
        let sum_ok = fixed_ok
            && std::str::from_utf8(&bytes[OFF_CHECKSUM..OFF_CHECKSUM + CHECKSUM_W])
                .ok()
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                == Some(checksum(bytes));
        if !sum_ok {
            // Either a torn read (read again) or a damaged record; the caller decides by retrying.
            return Parsed::Torn;
        }
        match Self::decode(bytes) {
            Ok(l) => Parsed::Lease(Box::new(l)),
            Err(why) => Parsed::NotALease(why),
        }
    }

    /// Decodes a record whose checksum failed every re-read, as far as its JSON allows.
    pub(crate) fn parse_damaged(bytes: &[u8]) -> Parsed {
        match Self::decode(bytes) {
            Ok(mut l) => {
                l.damaged = true;
                Parsed::Lease(Box::new(l))
            }
            Err(why) => Parsed::NotALease(format!("damaged leasehold record: {why}")),
        }
    }

    fn decode(bytes: &[u8]) -> Result<Lease, String> {
        let w: Wire = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
        match (w.leasehold, &w.mode) {
            (PLAIN_FORMAT_VERSION, None) => {}
            (FORMAT_VERSION, Some(m)) => {
                let width_ok = m.width <= m.slots.unwrap_or(MAX_WIDTH).min(MAX_WIDTH);
                if m.slots == Some(0) || !width_ok {
                    return Err(format!(
                        "mode {} with width {} out of range",
                        m.setting(),
                        m.width
                    ));
                }
            }
            (FORMAT_VERSION, None) => return Err("format version 2 without a mode".into()),
            (v, _) => return Err(format!("format version {v}")),
        }
        let b = &w;
        let id_ok = b.lease_id.len() == 32 && b.lease_id.bytes().all(|c| c.is_ascii_hexdigit());
        if !id_ok {
            return Err("lease_id is not 32 hex digits".into());
        }
        if b.ttl_ms == 0 || b.ttl_ms > 366 * 24 * 3600 * 1000 {
            return Err(format!("ttl_ms {} out of range", b.ttl_ms));
        }
        let h = &b.holder;
        if h.pid <= 0 || h.child_pid.is_some_and(|p| p <= 0) || h.pgid.is_some_and(|p| p <= 0) {
            return Err("holder pid out of range".into());
        }
        if !valid_text(&h.host, 255) || !valid_text(&h.user, 255) || !valid_text(&h.boot_id, 64) {
            return Err("holder identity too long".into());
        }
        Ok(Lease {
            state: w.state,
            heartbeat_seq: w.heartbeat_seq,
            heartbeat_at: w.heartbeat_at,
            lease_id: w.lease_id,
            token: w.token,
            ttl_ms: w.ttl_ms,
            acquired_at: w.acquired_at,
            holder: w.holder,
            ended: w.ended,
            mode: w.mode,
            history: History {
                last: w.last,
                last_start: w.last_start,
                deadline: w.deadline,
                acked: w.acked,
            },
            damaged: false,
        })
    }
}

/// A lease serialised ahead of time (while waiting), with its token and times left to fill in
/// when it is taken: the new holder's work under the mutex is then a few byte copies.
#[derive(Debug, Clone)]
pub(crate) struct Draft {
    lease: Lease,
    bytes: Vec<u8>,
    token_at: usize,
    acquired_at: usize,
}

impl Draft {
    /// Serialises `lease` (held, sequence 0) and finds where its token and acquisition time
    /// sit. `None` if its acquisition time is not the fixed width [`crate::format_rfc3339`]
    /// writes.
    pub(crate) fn new(lease: Lease) -> Option<Draft> {
        let bytes = lease.to_bytes();
        let find = |pat: &str| {
            bytes
                .windows(pat.len())
                .position(|w| w == pat.as_bytes())
                .map(|i| i + pat.len())
        };
        let token_at = find(P_TOKEN)?;
        let acquired_at = find(P_ACQUIRED)?;
        let fits = bytes.len() > token_at + TOKEN_W
            && bytes[token_at + TOKEN_W] == b','
            && lease.acquired_at.len() == RFC3339_WIDTH
            && bytes.get(acquired_at + RFC3339_WIDTH) == Some(&b'"');
        fits.then_some(Draft {
            lease,
            bytes,
            token_at,
            acquired_at,
        })
    }

    /// The lease drafted.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The record as it stands (token 0 and the time it was drafted, unless finished).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The lease as taken now, with `token`, acquired (and first heartbeat) at `now` (a
    /// [`crate::format_rfc3339`] time), and its exact bytes.
    pub(crate) fn finish(mut self, token: u64, now: &str) -> (Lease, Vec<u8>) {
        let t = format!("{token:>TOKEN_W$}");
        let now = fixed_time(now);
        self.bytes[self.token_at..self.token_at + TOKEN_W].copy_from_slice(t.as_bytes());
        self.bytes[self.acquired_at..self.acquired_at + RFC3339_WIDTH]
            .copy_from_slice(now.as_bytes());
        self.bytes[OFF_AT..OFF_AT + RFC3339_WIDTH].copy_from_slice(now.as_bytes());
        seal(&mut self.bytes);
        self.lease.token = token;
        self.lease.acquired_at = now.clone();
        self.lease.heartbeat_at = now;
        (self.lease, self.bytes)
    }
}

fn seal(bytes: &mut [u8]) {
    let sum = checksum(bytes);
    for (i, b) in bytes[OFF_CHECKSUM..OFF_CHECKSUM + CHECKSUM_W]
        .iter_mut()
        .enumerate()
    {
        *b = b"0123456789abcdef"[((sum >> (4 * (CHECKSUM_W - 1 - i))) & 0xf) as usize];
    }
}

/// Appends `n` right-aligned in `width` columns (as `format!("{n:>width$}")`), without a
/// formatter's allocation.
fn push_right_aligned(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let digits = &digits[i..];
    out.extend(std::iter::repeat_n(
        b' ',
        width.saturating_sub(digits.len()),
    ));
    out.extend_from_slice(digits);
}

/// The first place `needle` occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Appends [`fixed_time`]`(s)` without building it.
fn push_fixed_time(out: &mut Vec<u8>, s: &str) {
    let start = out.len();
    out.extend(
        s.chars()
            .filter(char::is_ascii_graphic)
            .take(RFC3339_WIDTH)
            .map(|c| c as u8),
    );
    let len = out.len() - start;
    out.extend(std::iter::repeat_n(b'Z', RFC3339_WIDTH - len));
}

/// Pads or cuts a timestamp to the fixed width, so a strange value can never shift the header.
fn fixed_time(s: &str) -> String {
    let mut t: String = s
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(RFC3339_WIDTH)
        .collect();
    while t.len() < RFC3339_WIDTH {
        t.push('Z');
    }
    t
}

/// Tells a newer leasehold format apart from a file that is not ours at all.
fn classify_foreign(bytes: &[u8]) -> Parsed {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(bytes)
        && let Some(v) = map.get("leasehold").and_then(|v| v.as_u64())
    {
        if v > FORMAT_VERSION {
            return Parsed::Newer(v);
        }
        return Parsed::NotALease(format!("leasehold format {v} with an unexpected layout"));
    }
    let printable = bytes
        .iter()
        .take(512)
        .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace());
    if printable {
        Parsed::NotALease("it holds other text".into())
    } else {
        Parsed::NotALease("it holds binary data".into())
    }
}

#[cfg(test)]
mod tests;
