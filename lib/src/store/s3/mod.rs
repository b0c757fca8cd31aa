//! The S3 store (cargo feature `s3`; PROTOCOL.md §15): `s3://BUCKET/KEY` locks, one object per
//! lock, replaced only by conditional PUTs.
//!
//! Owns: the URL, the AWS-style settings (endpoint, region, credentials: environment, then the
//! shared config and credentials files), the client (SigV4-signed GET and conditional PUT over
//! ureq, path-style for a custom endpoint), the object's format (a nonce line, then a §2 lease
//! record; version 2 with a shared or counted lock's holders' records after LOCK's: [`Object`])
//! and the probe that the server honours conditional writes. `acquire.rs` takes a
//! lease, `holding.rs` renews and releases it, `look.rs` is `status` and `break`, `ending.rs`
//! is `ack` (the endings ride in the object's record, PROTOCOL.md §15 *Endings*).
//! Must never: DELETE the object (several servers ignore `If-Match` on DELETE, and the token
//! counter lives in it); retry a conditional write whose outcome is unknown (a 5xx, a 409, a
//! broken connection) without reading first; write the same bytes twice (the ETag is the MD5
//! of the body: identical bytes would let a stale ETag's swap succeed) — every body carries a
//! fresh nonce; judge expiry by the server's clock.

pub(crate) mod acquire;
pub(crate) mod ending;
pub(crate) mod holding;
pub(crate) mod look;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ring::{digest, hmac};

use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsio::LockContent;
use crate::paths::LockPaths;
use crate::process::JobEvidence;
use crate::record::{Lease, MAX_LEASE_BYTES, Parsed};
use crate::store::Binding;

/// How long one request on the way to the lock (or for `status`/`break`) may take.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The first line of every object leasehold writes: this, a version, and a fresh nonce.
const MAGIC: &str = "leasehold-s3 1 ";

/// An S3 lock: where it is and how to reach it.
#[derive(Debug, Clone)]
pub(crate) struct S3Lock {
    /// The URL as given: what errors, verdicts and `LEASEHOLD_LOCK` name.
    pub url: PathBuf,
    pub bucket: String,
    pub key: String,
    /// `http(s)://host[:port]` without a trailing `/`.
    endpoint: String,
    /// Path-style (`endpoint/bucket/key`, a custom endpoint) or virtual-host style
    /// (`bucket.endpoint/key`, AWS).
    path_style: bool,
    region: String,
    creds: Creds,
}

#[derive(Clone, Default)]
struct Creds {
    access: String,
    secret: String,
    token: Option<String>,
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Creds({}, secret hidden)", self.access)
    }
}

/// Jobs of an S3 lock are bound to it by their environment alone (`LEASEHOLD_LOCK` = the URL as
/// given, `LEASEHOLD_LEASE_ID`); observations of a foreign heartbeat live in memory.
impl Binding for S3Lock {
    fn lock(&self) -> &Path {
        &self.url
    }
    fn evidence(&self, lease: &Lease) -> JobEvidence {
        JobEvidence::by_environment(&lease.lease_id, lease.holder.uid, &self.url)
    }
    fn observations(&self) -> Option<&LockPaths> {
        None
    }
}

/// One section of an INI-style AWS file (`~/.aws/credentials`, `~/.aws/config`).
fn ini_section(text: &str, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('#') || l.starts_with(';') || l.is_empty() {
            continue;
        }
        if let Some(name) = l.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside && let Some((k, v)) = l.split_once('=') {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

fn home_file(var: &str, rel: &str) -> Option<String> {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(rel),
    };
    std::fs::read_to_string(path).ok()
}

impl S3Lock {
    /// Parses `s3://BUCKET/KEY` and resolves the endpoint, region and credentials the AWS way.
    pub(crate) fn parse(url: &Path) -> Result<S3Lock> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let bad = |why: &str| Error::Settings(format!("{}: {why}", url.display()));
        let s = url
            .to_str()
            .ok_or_else(|| bad("an s3:// URL must be UTF-8"))?;
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (bucket, key) = rest
            .split_once('/')
            .ok_or_else(|| bad("expected s3://BUCKET/KEY"))?;
        if bucket.is_empty() || key.is_empty() {
            return Err(bad("expected s3://BUCKET/KEY (both non-empty)"));
        }
        if !bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(bad(
                "a bucket name has lowercase letters, digits, '-' and '.' only",
            ));
        }
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let config = home_file("AWS_CONFIG_FILE", ".aws/config").unwrap_or_default();
        let conf_section = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let conf = ini_section(&config, &conf_section);
        let shared =
            home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials").unwrap_or_default();
        let file_creds = ini_section(&shared, &profile);
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| conf.get("region").cloned())
            .unwrap_or_else(|| "us-east-1".into());
        let custom = var("AWS_ENDPOINT_URL_S3")
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .or_else(|| conf.get("endpoint_url").cloned());
        let (endpoint, path_style) = match custom {
            Some(e) => {
                let e = e.trim_end_matches('/').to_string();
                if !(e.starts_with("http://") || e.starts_with("https://"))
                    || e.splitn(4, '/').nth(3).is_some()
                {
                    return Err(bad(&format!(
                        "endpoint {e:?} (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) must be http(s)://HOST[:PORT]"
                    )));
                }
                (e, true)
            }
            None => (format!("https://s3.{region}.amazonaws.com"), false),
        };
        let pick = |env: &str, file: &str| var(env).or_else(|| file_creds.get(file).cloned());
        let (access, secret) = match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(a), Some(s)) => (a, s),
            _ => (
                file_creds
                    .get("aws_access_key_id")
                    .cloned()
                    .unwrap_or_default(),
                file_creds
                    .get("aws_secret_access_key")
                    .cloned()
                    .unwrap_or_default(),
            ),
        };
        if access.is_empty() || secret.is_empty() {
            return Err(bad(&format!(
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile \
                 {profile:?} keys in ~/.aws/credentials (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE)"
            )));
        }
        let token = pick("AWS_SESSION_TOKEN", "aws_session_token");
        Ok(S3Lock {
            url: url.to_path_buf(),
            bucket: bucket.into(),
            key: key.into(),
            endpoint,
            path_style,
            region,
            creds: Creds {
                access,
                secret,
                token,
            },
        })
    }

    /// The host (as the Host header has it) and the URL path of `key`.
    fn locate(&self, key: &str) -> (String, String, String) {
        let (scheme, host) = self
            .endpoint
            .split_once("://")
            .unwrap_or(("https", self.endpoint.as_str()));
        let host = if self.path_style {
            host.to_string()
        } else {
            format!("{}.{host}", self.bucket)
        };
        let mut path = String::new();
        if self.path_style {
            path.push('/');
            path.push_str(&uri_encode(&self.bucket, false));
        }
        path.push('/');
        path.push_str(&uri_encode(key, true));
        (scheme.to_string(), host, path)
    }
}

/// S3's URI encoding: everything but unreserved characters (and `/` in a key) as `%XX`.
fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sha256_hex(b: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, b).as_ref())
}

fn hmac_sha256(key: &[u8], msg: &str) -> Vec<u8> {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&k, msg.as_bytes()).as_ref().to_vec()
}

/// The condition of a PUT.
#[derive(Debug, Clone)]
pub(crate) enum Cond {
    /// `If-None-Match: *`: only if no object is there.
    Absent,
    /// `If-Match: ETAG` (unquoted, as Ceph accepts it; AWS accepts both).
    Match(String),
}

/// What a GET found.
#[derive(Debug)]
pub(crate) enum Got {
    Missing,
    Object { body: Vec<u8>, etag: String },
}

/// How a conditional PUT came out.
#[derive(Debug)]
pub(crate) enum Put {
    /// Written; the new ETag.
    Done(String),
    /// Not written: the condition failed (412; or 404, an `If-Match` on a missing key).
    Failed,
    /// Perhaps written, perhaps not (a 5xx, a 409, a broken connection, no answer in time):
    /// read before doing anything else.
    Unknown(String),
}

/// The client of one lock's object.
pub(crate) struct Client {
    pub lock: S3Lock,
    agent: ureq::Agent,
    /// Whether `If-Match` carries the ETag quoted (RFC 7232's form). Unquoted first: Ceph 16
    /// matches only that; a server that matches only the quoted form shows itself by a 412 on
    /// the very ETag the object has, and is then sent quotes.
    quoted: std::sync::atomic::AtomicBool,
}

impl Client {
    pub(crate) fn new(lock: S3Lock) -> Client {
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout_connect(Duration::from_secs(2))
            .build();
        Client {
            lock,
            agent,
            quoted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A signed request for `key` (SigV4, the payload's hash signed too, as Ceph requires).
    fn request(&self, method: &str, key: &str, body: &[u8], timeout: Duration) -> ureq::Request {
        let (scheme, host, path) = self.lock.locate(key);
        let now = format_rfc3339(std::time::SystemTime::now());
        // 2026-12-02T13:02:38.662000Z → 20261202T130238Z
        let date: String = now[..10].chars().filter(|c| *c != '-').collect();
        let time: String = now[11..19].chars().filter(|c| *c != ':').collect();
        let amz_date = format!("{date}T{time}Z");
        let payload = sha256_hex(body);
        let mut headers = vec![
            ("host", host.clone()),
            ("x-amz-content-sha256", payload.clone()),
            ("x-amz-date", amz_date.clone()),
        ];
        if let Some(t) = &self.lock.creds.token {
            headers.push(("x-amz-security-token", t.clone()));
        }
        let signed: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
        let signed = signed.join(";");
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let canonical = format!("{method}\n{path}\n\n{canonical_headers}\n{signed}\n{payload}");
        let scope = format!("{date}/{}/s3/aws4_request", self.lock.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            sha256_hex(canonical.as_bytes())
        );
        let mut k = hmac_sha256(format!("AWS4{}", self.lock.creds.secret).as_bytes(), &date);
        for part in [self.lock.region.as_str(), "s3", "aws4_request"] {
            k = hmac_sha256(&k, part);
        }
        let sig = hex(&hmac_sha256(&k, &to_sign));
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={sig}",
            self.lock.creds.access
        );
        let mut r = self
            .agent
            .request(method, &format!("{scheme}://{host}{path}"))
            .timeout(timeout)
            .set("Authorization", &auth);
        for (k, v) in &headers[1..] {
            r = r.set(k, v);
        }
        r
    }

    fn unavailable(&self, op: &'static str, why: String) -> Error {
        Error::Unavailable {
            path: self.lock.url.clone(),
            op,
            why: format!("{}: {why}", self.lock.endpoint),
        }
    }

    /// An answer that is neither success nor a condition: denied (77), or anything else.
    fn refusal(&self, op: &'static str, code: u16, resp: ureq::Response) -> Error {
        let body = read_limited(resp).unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let s3code = text
            .split("<Code>")
            .nth(1)
            .and_then(|r| r.split("</Code>").next())
            .unwrap_or("")
            .to_string();
        let kind = match code {
            401 | 403 => std::io::ErrorKind::PermissionDenied,
            _ => std::io::ErrorKind::Other,
        };
        if code >= 500 {
            return self.unavailable(op, format!("HTTP {code} {s3code}"));
        }
        Error::Io {
            path: self.lock.url.clone(),
            op,
            source: std::io::Error::new(kind, format!("HTTP {code} {s3code}")),
        }
    }

    /// Reads `key` (the lock's object unless probing).
    pub(crate) fn get_key(&self, key: &str, timeout: Duration) -> Result<Got> {
        const OP: &str = "read the lock's object";
        match self.request("GET", key, b"", timeout).call() {
            Ok(resp) => {
                let etag = etag_of(&resp);
                let body = read_limited(resp).map_err(|e| self.unavailable(OP, e.to_string()))?;
                Ok(Got::Object { body, etag })
            }
            Err(ureq::Error::Status(404, _)) => Ok(Got::Missing),
            Err(ureq::Error::Status(code, resp)) => Err(self.refusal(OP, code, resp)),
            Err(ureq::Error::Transport(t)) => Err(self.unavailable(OP, transport(&t))),
        }
    }

    pub(crate) fn get(&self, timeout: Duration) -> Result<Got> {
        self.get_key(&self.lock.key.clone(), timeout)
    }

    /// A conditional PUT of `body` at `key`. Errors other than the outcomes of [`Put`] (denied,
    /// a bad request) are `Err`.
    pub(crate) fn put_key(
        &self,
        key: &str,
        body: &[u8],
        cond: &Cond,
        timeout: Duration,
    ) -> Result<Put> {
        use std::sync::atomic::Ordering::Relaxed;
        let quoted = self.quoted.load(Relaxed);
        let r = self.put_once(key, body, cond, quoted, timeout)?;
        if let (Put::Failed, Cond::Match(e)) = (&r, cond)
            && let Ok(Got::Object { etag, .. }) = self.get_key(key, timeout)
            && etag == *e
        {
            // Refused on the ETag the object has: the server wants the other form. A 412
            // wrote nothing, so trying once more is no blind retry.
            self.quoted.store(!quoted, Relaxed);
            return self.put_once(key, body, cond, !quoted, timeout);
        }
        Ok(r)
    }

    fn put_once(
        &self,
        key: &str,
        body: &[u8],
        cond: &Cond,
        quoted: bool,
        timeout: Duration,
    ) -> Result<Put> {
        const OP: &str = "write the lock's object";
        let r = self.request("PUT", key, body, timeout);
        let r = match cond {
            Cond::Absent => r.set("If-None-Match", "*"),
            Cond::Match(e) if quoted => r.set("If-Match", &format!("\"{e}\"")),
            Cond::Match(e) => r.set("If-Match", e),
        };
        match r.send_bytes(body) {
            Ok(resp) => Ok(Put::Done(etag_of(&resp))),
            Err(ureq::Error::Status(412 | 404, _)) => Ok(Put::Failed),
            Err(ureq::Error::Status(code, _)) if code == 409 || code >= 500 => {
                Ok(Put::Unknown(format!("HTTP {code}")))
            }
            Err(ureq::Error::Status(code, resp)) => Err(self.refusal(OP, code, resp)),
            Err(ureq::Error::Transport(t)) => Ok(Put::Unknown(transport(&t))),
        }
    }

    pub(crate) fn put(&self, body: &[u8], cond: &Cond, timeout: Duration) -> Result<Put> {
        self.put_key(&self.lock.key.clone(), body, cond, timeout)
    }

    /// What the lock's object holds now (LOCK's record), with its ETag (`None` when missing).
    pub(crate) fn read(&self, timeout: Duration) -> Result<(LockContent, Option<String>, String)> {
        let o = self.object(timeout)?;
        let content = o.content(&self.lock.url, 0)?;
        Ok((content, o.etag, o.nonce))
    }

    /// The lock's object now, every record in it.
    pub(crate) fn object(&self, timeout: Duration) -> Result<Object> {
        match self.get(timeout)? {
            Got::Missing => Ok(Object::default()),
            Got::Object { body, etag } => {
                let (entries, nonce) = decode_entries(&self.lock.url, &body)?;
                Ok(Object {
                    entries,
                    etag: Some(etag),
                    nonce,
                })
            }
        }
    }

    /// Whether the server honours conditional writes: a create-if-absent of the scratch key
    /// `KEY.leasehold-probe` must fail once the key exists. A server that ignores
    /// `If-None-Match` (Garage 2.5 does) would let two contenders hold the lock at once: refused
    /// (exit 78). The scratch object stays (leasehold never deletes); once it exists the probe
    /// is one refused PUT.
    pub(crate) fn probe(&self, within: Duration) -> Result<()> {
        const OP: &str = "probe conditional writes";
        let key = format!("{}.leasehold-probe", self.lock.key);
        let body = || format!("{MAGIC}{}\nprobe\n", crate::builder::random_id());
        for _ in 0..2 {
            match self.put_key(&key, body().as_bytes(), &Cond::Absent, within)? {
                // Refused because the key exists: conditions are honoured.
                Put::Failed => return Ok(()),
                // Created (the first probe of this key), or, the second time, replaced.
                Put::Done(_) => {}
                Put::Unknown(why) => return Err(self.unavailable(OP, why)),
            }
        }
        Err(Error::UnsafeFileSystem {
            path: self.lock.url.clone(),
            why: format!(
                "the S3 server at {} ignores conditional writes (a PUT with If-None-Match: * \
                 replaced an existing object): two contenders could hold the lock at once; use a \
                 server that honours If-None-Match and If-Match (AWS S3, Ceph RGW)",
                self.lock.endpoint
            ),
        })
    }
}

/// The ETag, without quotes (Ceph compares `If-Match` with the unquoted form only).
fn etag_of(resp: &ureq::Response) -> String {
    resp.header("ETag")
        .unwrap_or("")
        .trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

fn read_limited(resp: ureq::Response) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    resp.into_reader()
        .take(MAX_LEASE_BYTES + 4096)
        .read_to_end(&mut out)?;
    Ok(out)
}

fn transport(t: &ureq::Transport) -> String {
    // ureq's Display starts with the URL and repeats the kind: keep what happened.
    let mut s = t.to_string();
    if let Some(i) = s.find(": ") {
        s = s[i + 2..].to_string();
    }
    let kind = format!("{}: ", t.kind());
    while let Some(rest) = s.strip_prefix(&kind) {
        s = rest.to_string();
    }
    s
}

/// The first line of an object that also holds the records of a shared or counted lock's
/// holders (PROTOCOL.md §15, *Shared leases and slots*): a version an older leasehold refuses.
const MAGIC_2: &str = "leasehold-s3 2 ";

/// The line before holder K's record in a version-2 object (no line of a §2 record starts so).
const SLOT_LINE: &str = "%leasehold-slot ";

/// The lock's object as read: its records' bytes — entry 0 LOCK's, entry K+1 holder K's of a
/// shared or counted lock (empty: none) —, its ETag (`None`: no object) and nonce.
#[derive(Debug, Default, Clone)]
pub(crate) struct Object {
    pub entries: Vec<Vec<u8>>,
    pub etag: Option<String>,
    pub nonce: String,
}

impl Object {
    /// What entry `i` holds (missing past the last).
    pub(crate) fn content(&self, url: &Path, i: usize) -> Result<LockContent> {
        match self.entries.get(i) {
            // No object at all, or no record for this holder.
            None => Ok(LockContent::Missing),
            Some(b) if i > 0 && b.is_empty() => Ok(LockContent::Missing),
            Some(b) => parse_record(url, b),
        }
    }

    /// The object's bytes with entry `i` replaced by `record` (the others as read), and the
    /// new body's nonce.
    pub(crate) fn with(&self, i: usize, record: &[u8]) -> (Vec<u8>, String) {
        let mut entries = self.entries.clone();
        if entries.len() <= i {
            entries.resize(i + 1, Vec::new());
        }
        entries[i] = record.to_vec();
        encode_entries(&entries)
    }

    /// The condition that writes over exactly this object.
    pub(crate) fn cond(&self) -> Cond {
        match &self.etag {
            None => Cond::Absent,
            Some(e) => Cond::Match(e.clone()),
        }
    }

    /// Replaces entry `i` with `record` here, as written under `etag`.
    pub(crate) fn wrote(&mut self, i: usize, record: &[u8], etag: String, nonce: String) {
        if self.entries.len() <= i {
            self.entries.resize(i + 1, Vec::new());
        }
        self.entries[i] = record.to_vec();
        self.etag = Some(etag);
        self.nonce = nonce;
    }
}

/// An object's bytes: `leasehold-s3 1 NONCE\n` then a §2 lease record; empty is free.
#[cfg(test)]
pub(crate) fn encode(record: &[u8]) -> (Vec<u8>, String) {
    encode_entries(&[record.to_vec()])
}

/// An object's bytes for LOCK's record and the holders' (see [`Object`]): version 1 when
/// there are no holders' records, else `leasehold-s3 2 NONCE\n`, LOCK's record, then for
/// each holder K a line `%leasehold-slot K` and its record (nothing for none).
pub(crate) fn encode_entries(entries: &[Vec<u8>]) -> (Vec<u8>, String) {
    let nonce = crate::builder::random_id();
    // Holders' records past the last one anybody wrote are dropped (LOCK's always stays).
    let keep = entries
        .iter()
        .rposition(|e| !e.is_empty())
        .map_or(1, |i| i + 1)
        .min(entries.len());
    let entries = &entries[..keep];
    let magic = if entries.len() > 1 { MAGIC_2 } else { MAGIC };
    let mut out = format!("{magic}{nonce}\n").into_bytes();
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            if out.last().is_some_and(|b| *b != b'\n') {
                out.push(b'\n');
            }
            out.extend_from_slice(format!("{SLOT_LINE}{}\n", i - 1).as_bytes());
        }
        out.extend_from_slice(e);
    }
    (out, nonce)
}

/// The records of an object's bytes (see [`Object`]), and its nonce.
pub(crate) fn decode_entries(url: &Path, body: &[u8]) -> Result<(Vec<Vec<u8>>, String)> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((vec![Vec::new()], String::new()));
    }
    let not = |what: String| Error::NotALease {
        path: url.to_path_buf(),
        what,
    };
    let nl = body.iter().position(|b| *b == b'\n').unwrap_or(body.len());
    let first = String::from_utf8_lossy(&body[..nl]);
    let rest = body.get(nl + 1..).unwrap_or_default();
    if let Some(nonce) = first.strip_prefix(MAGIC) {
        return Ok((vec![rest.to_vec()], nonce.to_string()));
    }
    let Some(nonce) = first.strip_prefix(MAGIC_2) else {
        return Err(not(
            "an object that leasehold did not write (no `leasehold-s3 1` line)".into(),
        ));
    };
    let mut entries = vec![Vec::new()];
    for line in rest.split_inclusive(|b| *b == b'\n') {
        if let Some(k) = line.strip_prefix(SLOT_LINE.as_bytes()) {
            let k = std::str::from_utf8(k)
                .ok()
                .and_then(|k| k.trim().parse::<usize>().ok());
            if k != Some(entries.len() - 1) || entries.len() > crate::record::MAX_WIDTH as usize {
                return Err(not(
                    "a holder's line out of order in the lock's object".into()
                ));
            }
            entries.push(Vec::new());
        } else if let Some(e) = entries.last_mut() {
            e.extend_from_slice(line);
        }
    }
    Ok((entries, nonce.to_string()))
}

/// The content of an object's bytes (LOCK's record), and its nonce.
#[cfg(test)]
pub(crate) fn decode(url: &Path, body: &[u8]) -> Result<(LockContent, String)> {
    let (entries, nonce) = decode_entries(url, body)?;
    let content = match entries.first() {
        Some(e) => parse_record(url, e)?,
        None => LockContent::Empty,
    };
    Ok((content, nonce))
}

/// One record of an object.
fn parse_record(url: &Path, record: &[u8]) -> Result<LockContent> {
    let not = |what: String| Error::NotALease {
        path: url.to_path_buf(),
        what,
    };
    match Lease::parse(record) {
        Parsed::Lease(l) => Ok(LockContent::Lease(l, record.to_vec())),
        Parsed::Empty => Ok(LockContent::Empty),
        Parsed::Torn => Err(not("a lease record whose checksum does not match".into())),
        Parsed::Newer(v) => Err(Error::NewerFormat {
            path: url.to_path_buf(),
            found: v,
            supported: crate::record::FORMAT_VERSION,
        }),
        Parsed::NotALease(w) => Err(not(w)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_env<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the tests of this module are the only ones touching these variables, and
        // they set the same values.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", "AK");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "SK");
            std::env::set_var("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9/");
        }
        f()
    }

    #[test]
    fn an_s3_url_needs_a_bucket_and_a_key_and_a_plain_bucket_name() {
        with_env(|| {
            for bad in [
                "s3://bucket",
                "s3:///key",
                "s3://bucket/",
                "s3://Bad_Bucket/k",
            ] {
                let e = S3Lock::parse(Path::new(bad)).unwrap_err();
                assert!(matches!(e, Error::Settings(_)), "{bad}: {e}");
            }
            let l = S3Lock::parse(Path::new("s3://locks/a b/c")).unwrap();
            assert_eq!((l.bucket.as_str(), l.key.as_str()), ("locks", "a b/c"));
        });
    }

    #[test]
    fn a_custom_endpoint_is_addressed_path_style_with_the_key_uri_encoded() {
        with_env(|| {
            let l = S3Lock::parse(Path::new("s3://locks/a b/c+d")).unwrap();
            let (scheme, host, path) = l.locate(&l.key);
            assert_eq!(scheme, "http");
            assert_eq!(host, "127.0.0.1:9");
            assert_eq!(path, "/locks/a%20b/c%2Bd");
        });
    }

    #[test]
    fn holders_records_ride_after_locks_and_come_back_as_written() {
        let url = Path::new("s3://b/k");
        // A plain lock's object stays version 1, with or without trailing empty holders.
        let (plain, _) = encode_entries(&[b"{\n}\n".to_vec(), Vec::new()]);
        assert!(plain.starts_with(MAGIC.as_bytes()));
        let (entries, _) = decode_entries(url, &plain).unwrap();
        assert_eq!(entries, vec![b"{\n}\n".to_vec()]);
        // Holders' records, one missing between two, the last without a final newline.
        let written = vec![
            b"{\n  \"lock\": 1\n}\n".to_vec(),
            b"{\n  \"h\": 0\n}\n".to_vec(),
            Vec::new(),
            b"{\n  \"h\": 2\n}".to_vec(),
        ];
        let (body, nonce) = encode_entries(&written);
        assert!(body.starts_with(MAGIC_2.as_bytes()));
        let (entries, n) = decode_entries(url, &body).unwrap();
        assert_eq!(n, nonce);
        assert_eq!(entries, written);
        let o = Object {
            entries,
            etag: Some("e".into()),
            nonce: n,
        };
        assert!(matches!(o.content(url, 2).unwrap(), LockContent::Missing));
        assert!(matches!(o.content(url, 9).unwrap(), LockContent::Missing));
        // Replacing one record keeps the others.
        let (body, _) = o.with(2, b"{\n  \"h\": 1\n}\n");
        let (entries, _) = decode_entries(url, &body).unwrap();
        assert_eq!(entries[1], written[1]);
        assert_eq!(entries[2], b"{\n  \"h\": 1\n}\n".to_vec());
        // Out-of-order holder lines are no object of ours.
        let bad = format!("{MAGIC_2}n\n{{}}\n{SLOT_LINE}1\n{{}}\n");
        assert!(decode_entries(url, bad.as_bytes()).is_err());
    }

    #[test]
    fn an_object_not_written_by_leasehold_is_not_a_lease_and_every_encoding_differs() {
        let url = Path::new("s3://b/k");
        let e = decode(url, b"{\"ID\":\"terraform\"}").unwrap_err();
        assert!(matches!(e, Error::NotALease { .. }), "{e}");
        assert!(matches!(decode(url, b"").unwrap().0, LockContent::Empty));
        let (a, na) = encode(b"same record\n");
        let (b, nb) = encode(b"same record\n");
        assert_ne!(
            a, b,
            "the same record twice must give different bytes (ETags)"
        );
        assert_ne!(na, nb);
    }
}
