//! The etcd store: leases on an etcd cluster, for `etcd://HOST:PORT[,HOST:PORT...]/NAME` locks.
//!
//! Owns: naming an etcd lock (its URL, endpoints and key prefix — `/` and `%` in the name
//! escaped, so that no lock's keys lie under another's prefix — [`EtcdLock`]), the connection
//! to the cluster with TLS and a user from the `ETCDCTL_*` environment ([`Conn`]: a client per
//! endpoint on a small current-thread runtime owned by the connection, built only for an etcd
//! lock), failing every call over from an endpoint that cannot serve it to the next, and the
//! typed errors that name the endpoints and the cause in words (`Error::Unavailable` when no
//! endpoint could serve). The lock recipe itself (etcd's own, so
//! that `etcdctl lock NAME` and leasehold exclude each other) is in `acquire.rs`, `--shared`
//! and `--slots N` on the same line in `shared.rs`, the held lease in `holding.rs`, `status`
//! and `break` in `look.rs`, the lock's history of endings in `ending.rs`; PROTOCOL.md §14
//! states the layout and the safety argument.
//! Must never: start a runtime or a thread for a lock that is not etcd's; install a
//! process-global handler; wait on the cluster without a deadline.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Txn, TxnResponse};

use crate::error::{Error, Result};
use crate::paths::LockPaths;
use crate::process::JobEvidence;
use crate::record::Lease;
use crate::store::binding::Binding;

pub(crate) mod acquire;
pub(crate) mod ending;
pub(crate) mod holding;
pub(crate) mod look;
pub(crate) mod shared;

/// The URL scheme of an etcd lock.
pub(crate) const SCHEME: &str = "etcd://";

/// How long connecting (and any one request outside a wait) may take, all endpoints tried.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// An etcd lock, as its URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdLock {
    /// The URL as given: what errors, verdicts and `LEASEHOLD_LOCK` name.
    pub url: PathBuf,
    /// The endpoints, each with its scheme (`http://` or `https://`).
    pub endpoints: Vec<String>,
    /// The lock's name: keys live under `NAME/`.
    pub name: String,
}

impl EtcdLock {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/NAME`, or `etcd:///NAME` with the endpoints of
    /// `ETCDCTL_ENDPOINTS` (default `127.0.0.1:2379`, as etcdctl's), reading the environment.
    pub(crate) fn parse(url: &Path) -> Result<EtcdLock> {
        let var = |k: &str| std::env::var(k).ok();
        let tls = std::env::var_os("ETCDCTL_CACERT").is_some()
            || std::env::var_os("ETCDCTL_CERT").is_some();
        EtcdLock::parse_with(url, var("ETCDCTL_ENDPOINTS").as_deref(), tls)
    }

    /// [`EtcdLock::parse`] given `ETCDCTL_ENDPOINTS` and whether a CA or client certificate is
    /// configured (`tls`: endpoints written without a scheme then use `https://`, as etcdctl's).
    /// An endpoint may carry its scheme (`http://h:p`, `https://h:p`), in the URL's `HOST:PORT`
    /// list too; all of them must agree on it.
    pub(crate) fn parse_with(url: &Path, env: Option<&str>, tls: bool) -> Result<EtcdLock> {
        let bad = |why: &str| Error::Settings(format!("{}: {why}", url.display()));
        let s = url
            .to_str()
            .ok_or_else(|| bad("an etcd lock URL must be UTF-8"))?;
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("not an etcd:// URL"))?;
        let (hosts, name) = split_hosts(rest);
        if name.is_empty() || name.ends_with('/') {
            return Err(bad("no lock name: use etcd://HOST:PORT/NAME"));
        }
        let (hosts, from) = match hosts {
            "" => match env {
                Some(e) => (e, "ETCDCTL_ENDPOINTS"),
                None => ("127.0.0.1:2379", "the default endpoint"),
            },
            h => (h, "the URL"),
        };
        let mut endpoints = Vec::new();
        for h in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            endpoints.push(
                endpoint(h, tls)
                    .map_err(|why| bad(&format!("endpoint {:?} (from {from}): {why}", h)))?,
            );
        }
        if endpoints.is_empty() {
            return Err(bad(&format!(
                "no endpoints in {from}: use etcd://HOST:PORT/NAME or set ETCDCTL_ENDPOINTS"
            )));
        }
        let secure = |e: &String| e.starts_with("https://");
        if endpoints.iter().any(secure) && !endpoints.iter().all(secure) {
            return Err(bad(&format!(
                "endpoints {} mix http:// and https://: one connection uses TLS for all or none",
                endpoints.join(",")
            )));
        }
        Ok(EtcdLock {
            url: url.to_path_buf(),
            endpoints,
            name: name.to_string(),
        })
    }

    /// Whether the connection uses TLS (its endpoints are `https://`).
    pub(crate) fn tls(&self) -> bool {
        self.endpoints.iter().all(|e| e.starts_with("https://"))
    }

    /// The prefix every contender's key lives under: the name with `%` and `/` escaped (`%25`,
    /// `%2F`), and `/`. A name without either is its own prefix, `NAME/`, as `etcdctl lock NAME`
    /// has it; escaping `/` keeps one lock's keys from lying under another's prefix (`a/b`'s
    /// keys under `a%2Fb/`, not under `a/`), and escaping `%` keeps the mapping one-to-one.
    pub(crate) fn prefix(&self) -> String {
        format!("{}/", self.name.replace('%', "%25").replace('/', "%2F"))
    }

    /// The key of the contender holding etcd lease `lease` (etcd's recipe: the prefix and the
    /// lease id in hex).
    pub(crate) fn key(&self, lease: i64) -> String {
        format!("{}{lease:x}", self.prefix())
    }

    /// The prefix of the lock's job records: `leasehold:jobs:`, the name with `%`, `/` and `:`
    /// escaped (`%25`, `%2F`, `%3A`), and `:`. A contender whose record names its command's
    /// process group keeps a copy here, without a lease, from the moment it joins the line
    /// ([`EtcdLock::job_key`]), so that when it dies holding the lock the next owner on its host
    /// can stop what its job left behind. No such key holds a `/`, so none is ever under a
    /// lock's prefix `NAME/` (none joins a line); escaping `:` keeps one lock's prefix from
    /// being the start of another's (`a:` and `a%3Ab:`).
    pub(crate) fn jobs_prefix(&self) -> String {
        let name = self
            .name
            .replace('%', "%25")
            .replace('/', "%2F")
            .replace(':', "%3A");
        format!("leasehold:jobs:{name}:")
    }

    /// The job record of the contender holding etcd lease `lease`: [`EtcdLock::jobs_prefix`]
    /// and the lease id in hex, as in its key.
    pub(crate) fn job_key(&self, lease: i64) -> String {
        format!("{}{lease:x}", self.jobs_prefix())
    }

    /// An answer from endpoint(s) `at` refusing `op`: names them and the cause.
    pub(crate) fn error_at(
        &self,
        op: &'static str,
        at: &str,
        cause: impl std::fmt::Display,
    ) -> Error {
        Error::io(
            &self.url,
            op,
            std::io::Error::other(format!("etcd at {at}: {cause}")),
        )
    }
}

/// Splits what follows `etcd://` into its endpoint list and the lock's name: the name starts at
/// the first `/` that is not part of an endpoint's own `http://` or `https://`.
fn split_hosts(rest: &str) -> (&str, &str) {
    let mut i = 0;
    loop {
        // At the start of an endpoint: skip its scheme, if it has one.
        if let Some(s) = ["http://", "https://"]
            .iter()
            .find(|s| rest[i..].starts_with(**s))
        {
            i += s.len();
        }
        // The endpoint ends at `,` (another follows) or `/` (the name follows).
        match rest[i..].find([',', '/']) {
            None => return (rest, ""),
            Some(j) if rest.as_bytes()[i + j] == b',' => i += j + 1,
            Some(j) => return (&rest[..i + j], &rest[i + j + 1..]),
        }
    }
}

/// One endpoint, `HOST:PORT` with an optional `http://` or `https://` (and trailing `/`), as
/// `scheme://HOST:PORT`; a bare one gets `https://` when `tls`. Why not, if it is not one.
fn endpoint(h: &str, tls: bool) -> std::result::Result<String, String> {
    let (scheme, hp) = match h.split_once("://") {
        Some(("http", hp)) => ("http", hp),
        Some(("https", hp)) => ("https", hp),
        Some((other, _)) => {
            return Err(format!(
                "unsupported scheme {other:?}: use http:// or https:// (or none)"
            ));
        }
        None if tls => ("https", h),
        None => ("http", h),
    };
    let hp = hp.strip_suffix('/').unwrap_or(hp);
    let (host, port) = hp
        .rsplit_once(':')
        .ok_or("no port: write HOST:PORT (etcd's client port is usually 2379)")?;
    let v6 = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    if host.is_empty() || host.contains(['/', '@', '?', '#']) || (host.contains(':') && !v6) {
        return Err(format!(
            "{host:?} is not a host name or address (an IPv6 address goes in brackets)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(format!("{scheme}://{host}:{p}")),
        _ => Err(format!("port {port:?} is not a port number")),
    }
}

/// An etcd lock's jobs are bound to it by their environment alone (`LEASEHOLD_LOCK` = the URL
/// as given, `LEASEHOLD_LEASE_ID`): it has no mutex file; observations live in memory.
impl Binding for EtcdLock {
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

/// A connection to the cluster: a client per endpoint, each connected when first used, and the
/// runtime they run on (current-thread: it runs only while one of our calls waits on it).
///
/// Every call goes to the endpoint that last answered; an endpoint that cannot serve it (the
/// connection refused or broken, no leader, no answer within its share of the call's time)
/// hands it to the next, in the URL's order, until one answers or each was tried once
/// ([`Conn::failover`]). etcd-client's own balanced channel, given several endpoints, sends a
/// request to a dead one and returns its error; it is therefore given one endpoint at a time.
pub(crate) struct Conn {
    pub lock: EtcdLock,
    rt: tokio::runtime::Runtime,
    opts: ConnectOptions,
    /// One client per endpoint, in the URL's order, made when first used.
    clients: Mutex<Vec<Option<Client>>>,
    /// The endpoint that answered last: where the next call goes first.
    current: AtomicUsize,
    /// Whether job records are kept and read (false once the cluster said our user may not
    /// touch `leasehold:jobs:`; the remnant rule at takeover then cannot apply, PROTOCOL §14).
    jobs: AtomicBool,
    /// Whether the lock's history is kept (false once the cluster said our user may not touch
    /// it: the lock is then used without endings, PROTOCOL §14 *Endings*).
    history: AtomicBool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("lock", &self.lock).finish()
    }
}

impl Conn {
    /// A connection to the lock's endpoints, with TLS and a user as the `ETCDCTL_*` environment
    /// says. Nothing is sent yet: the first call connects, failing over as every call does.
    pub(crate) fn connect(lock: EtcdLock) -> Result<Conn> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io(&lock.url, "start the etcd client's runtime", e))?;
        let opts = options(&lock)?;
        let clients = Mutex::new(vec![None; lock.endpoints.len()]);
        Ok(Conn {
            lock,
            rt,
            opts,
            clients,
            current: AtomicUsize::new(0),
            jobs: AtomicBool::new(true),
            history: AtomicBool::new(true),
        })
    }

    /// Whether this connection keeps and reads job records ([`EtcdLock::jobs_prefix`]).
    pub(crate) fn keeps_jobs(&self) -> bool {
        self.jobs.load(Ordering::Relaxed)
    }

    /// Whether this connection keeps the lock's history ([`EtcdLock::history_key`]).
    pub(crate) fn keeps_history(&self) -> bool {
        self.history.load(Ordering::Relaxed)
    }

    /// Stops using the lock's history: a shared or counted holder's holding is one of several
    /// at once, and the history names one holding (PROTOCOL.md §14 *Endings*).
    pub(crate) fn without_history(&self) {
        self.history.store(false, Ordering::Relaxed);
    }

    /// After `e`: when the cluster refused our user the lock's history, stops using it
    /// (`true`: the lock is used without endings).
    pub(crate) fn history_denied(&self, e: &Error) -> bool {
        let denied = e.to_string().contains("permission denied");
        if denied {
            self.history.store(false, Ordering::Relaxed);
        }
        denied
    }

    /// After `e`: when the cluster refused our user the job records, stops using them and says
    /// so (`true`: the same request may be made again without them).
    pub(crate) fn jobs_denied(&self, e: &Error) -> bool {
        let denied = self.keeps_jobs() && e.to_string().contains("permission denied");
        if denied {
            self.jobs.store(false, Ordering::Relaxed);
        }
        denied
    }

    /// The client of endpoint `i`, connected (and authenticated, with a user) when first asked.
    async fn client(&self, i: usize) -> std::result::Result<Client, etcd_client::Error> {
        let cached = lock(&self.clients)[i].clone();
        if let Some(c) = cached {
            return Ok(c);
        }
        let ep = [self.lock.endpoints[i].as_str()];
        let c = Client::connect(ep, Some(self.opts.clone())).await?;
        lock(&self.clients)[i] = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` with a client, at most `timeout` in all, failing over: starting with the
    /// endpoint that answered last, an endpoint that cannot serve (see [`moves_on`]) or does
    /// not answer within its share of the time left hands the call to the next. Errors name
    /// the endpoint, `op` and the cause in words; [`Error::Unavailable`] when none could serve.
    /// `f` may run once per endpoint: what it sends must be safe to send again (etcd's
    /// transactions here compare before they write).
    pub(crate) async fn failover<T, F, Fut>(
        &self,
        op: &'static str,
        timeout: Duration,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let end = tokio::time::Instant::now() + timeout;
        let n = self.lock.endpoints.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut tried = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            // An endpoint that hangs may use its share of the time left, not all of it.
            let share = left / u32::try_from(n - k).unwrap_or(1);
            let attempt = async {
                let c = self.client(i).await?;
                f(c).await
            };
            let ep = &self.lock.endpoints[i];
            match tokio::time::timeout(share, attempt).await {
                Ok(Ok(t)) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(t);
                }
                Ok(Err(e)) if moves_on(&e) => tried.push(format!("{ep}: {}", words(&e))),
                Ok(Err(e)) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Err(self.lock.error_at(op, ep, words(&e)));
                }
                Err(_) => tried.push(format!(
                    "{ep}: deadline exceeded ({})",
                    crate::human_duration(share)
                )),
            }
            // The next call starts where this one goes next.
            self.current.store((i + 1) % n, Ordering::Relaxed);
        }
        Err(Error::Unavailable {
            path: self.lock.url.clone(),
            op,
            why: tried.join("; "),
        })
    }

    /// [`Conn::failover`] on the runtime, at most `timeout`.
    pub(crate) fn call<T, F, Fut>(&self, op: &'static str, timeout: Duration, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.rt.block_on(self.failover(op, timeout, f))
    }

    /// [`Conn::call`] with the default timeout.
    pub(crate) fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call(op, CALL_TIMEOUT, f)
    }

    /// Transaction `t`, at most `timeout` (failing over: `t` must compare before it writes).
    pub(crate) fn txn(&self, op: &'static str, timeout: Duration, t: Txn) -> Result<TxnResponse> {
        self.call(op, timeout, |mut c| {
            let t = t.clone();
            async move { c.txn(t).await }
        })
    }

    /// Revokes etcd lease `id`, at most `timeout`.
    pub(crate) fn revoke(&self, op: &'static str, timeout: Duration, id: i64) -> Result<()> {
        self.call(op, timeout, |mut c| async move {
            c.lease_revoke(id).await.map(drop)
        })
    }

    /// Runs `f` on the runtime (for waits that keep their own deadline).
    pub(crate) fn block_on<T>(&self, f: impl Future<Output = T>) -> T {
        self.rt.block_on(f)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// gRPC status codes (google.golang.org/grpc/codes), as numbers: tonic is not ours to name.
const GRPC_CANCELLED: i32 = 1;
const GRPC_UNKNOWN: i32 = 2;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_UNAVAILABLE: i32 = 14;

/// Whether `e`, from one endpoint, says that endpoint cannot serve us now, so that another may:
/// the connection refused, broken or timed out, or gRPC's UNAVAILABLE (which is also how etcd
/// says "no leader", "leader changed" and "request timed out"). Never an answer about our
/// request itself (permission denied, lease not found, a compare that failed).
pub(crate) fn moves_on(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(
            i32::from(s.code()),
            GRPC_CANCELLED | GRPC_UNKNOWN | GRPC_DEADLINE_EXCEEDED | GRPC_UNAVAILABLE
        ),
        // A stream the member closed before its first answer.
        etcd_client::Error::WatchError(m) => m.starts_with("failed to create"),
        _ => false,
    }
}

/// `e` in words, on one line: etcd's own message without its `etcdserver: ` prefix, or for a
/// connection that failed, what the system said (`connection refused`), never the client's
/// debug dump of nested errors.
pub(crate) fn words(e: &etcd_client::Error) -> String {
    let io = |mut src: Option<&(dyn std::error::Error + 'static)>| {
        while let Some(s) = src {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind as K;
                return Some(match io.kind() {
                    k @ (K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::AddrNotAvailable) => k.to_string(),
                    K::TimedOut => "deadline exceeded".into(),
                    _ => io.to_string(),
                });
            }
            src = s.source();
        }
        None
    };
    let one_line = |m: &str| m.split_whitespace().collect::<Vec<_>>().join(" ");
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            let m = s.message().trim_start_matches("etcdserver: ");
            let m = if m.is_empty() {
                s.code().description()
            } else {
                m
            };
            match io(std::error::Error::source(s)) {
                // The connection failed: what the system said is the whole story.
                Some(cause) => cause,
                None if i32::from(s.code()) == GRPC_DEADLINE_EXCEEDED => "deadline exceeded".into(),
                None => one_line(m),
            }
        }
        etcd_client::Error::TransportError(t) => {
            io(Some(t)).unwrap_or_else(|| one_line(&t.to_string()))
        }
        etcd_client::Error::IoError(i) => io(Some(i)).unwrap_or_else(|| i.to_string()),
        other => one_line(&other.to_string()),
    }
}

/// When `e` says the cluster cannot serve us for now (no member reachable, no leader: an
/// election, a cluster just resumed or without a quorum; no answer in time), each endpoint
/// tried and why, to say after "the etcd cluster"; `None` for every other error. The one home
/// of this check.
pub(crate) fn unavailable(e: &Error) -> Option<&str> {
    match e {
        Error::Unavailable { why, .. } => Some(why),
        _ => None,
    }
}

/// The connection options the `ETCDCTL_*` environment asks for.
fn options(lock: &EtcdLock) -> Result<ConnectOptions> {
    // Without a leader a member cannot renew a lease: fail fast rather than hang.
    let mut o = ConnectOptions::new()
        .with_require_leader(true)
        .with_connect_timeout(CALL_TIMEOUT);
    if let Ok(u) = std::env::var("ETCDCTL_USER") {
        let (user, password) = match (u.split_once(':'), std::env::var("ETCDCTL_PASSWORD")) {
            (_, Ok(p)) => (u.clone(), p),
            (Some((n, p)), _) => (n.to_string(), p.to_string()),
            (None, _) => {
                return Err(Error::Settings(format!(
                    "{}: ETCDCTL_USER must be user:password (or set ETCDCTL_PASSWORD)",
                    lock.url.display()
                )));
            }
        };
        o = o.with_user(user, password);
    }
    let read = |var: &str| -> Result<Option<Vec<u8>>> {
        let Some(p) = std::env::var_os(var) else {
            return Ok(None);
        };
        std::fs::read(&p)
            .map(Some)
            .map_err(|e| Error::io(PathBuf::from(&p), "read (named by $ETCDCTL_*)", e))
    };
    if !lock.tls() {
        // Plain http:// endpoints: certificates in the environment are not used.
        return Ok(o);
    }
    let (ca, cert, key) = (
        read("ETCDCTL_CACERT")?,
        read("ETCDCTL_CERT")?,
        read("ETCDCTL_KEY")?,
    );
    let Some(ca) = ca else {
        return Err(Error::Settings(format!(
            "{}: endpoint {} is https:// but ETCDCTL_CACERT is not set: name the CA that signed \
             the cluster's certificates (no system roots are used)",
            lock.url.display(),
            lock.endpoints[0]
        )));
    };
    let mut tls =
        etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    match (cert, key) {
        (Some(c), Some(k)) => tls = tls.identity(etcd_client::Identity::from_pem(c, k)),
        (None, None) => {}
        _ => {
            return Err(Error::Settings(format!(
                "{}: ETCDCTL_CERT and ETCDCTL_KEY go together",
                lock.url.display()
            )));
        }
    }
    o = o.with_tls(tls);
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_endpoints_and_a_lock_whose_keys_follow_etcds_recipe() {
        let l = EtcdLock::parse(Path::new("etcd://10.0.0.1:2379,h:2379/jobs/nightly")).unwrap();
        assert_eq!(l.name, "jobs/nightly");
        assert!(l.endpoints[0].ends_with("://10.0.0.1:2379"));
        assert!(l.endpoints[1].ends_with("://h:2379"));
        // `/` in a name is escaped, so that no lock's keys lie under another's prefix.
        assert_eq!(l.prefix(), "jobs%2Fnightly/");
        // etcd's concurrency.Mutex: fmt.Sprintf("%s%x", pfx, leaseID).
        assert_eq!(l.key(0x694d_7d1f), "jobs%2Fnightly/694d7d1f");
        let plain = EtcdLock::parse(Path::new("etcd://h:2379/nightly")).unwrap();
        assert_eq!(plain.key(0x1f), "nightly/1f", "etcdctl lock nightly's keys");
    }

    #[test]
    fn no_locks_keys_lie_under_another_locks_prefix() {
        let names = ["a", "a/b", "a%2Fb", "a%b", "a/b/c", "a%", "b"];
        let locks: Vec<EtcdLock> = names
            .iter()
            .map(|n| EtcdLock::parse(Path::new(&format!("etcd://h:1/{n}"))).unwrap())
            .collect();
        for x in &locks {
            for y in &locks {
                if x.name != y.name {
                    assert!(
                        !x.key(0x1f).starts_with(&y.prefix()),
                        "{}'s key {} lies under {}'s prefix {}",
                        x.name,
                        x.key(0x1f),
                        y.name,
                        y.prefix()
                    );
                }
            }
        }
    }

    fn parse(url: &str, env: Option<&str>, tls: bool) -> Result<EtcdLock> {
        EtcdLock::parse_with(Path::new(url), env, tls)
    }

    #[test]
    fn endpoints_come_from_the_url_else_etcdctl_endpoints_else_the_default() {
        let l = parse("etcd:///job", Some("a:1, http://b:2/,https://c:3"), false);
        let e = l.unwrap_err().to_string();
        assert!(e.contains("mix http:// and https://"), "{e}");
        let l = parse("etcd:///job", Some("a:1, http://b:2/"), false).unwrap();
        assert_eq!(l.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(l.name, "job");
        assert!(!l.tls());
        let l = parse("etcd:///job", None, false).unwrap();
        assert_eq!(l.endpoints, ["http://127.0.0.1:2379"]);
        // The URL's own endpoints win over the environment's.
        let l = parse("etcd://h:9/job", Some("a:1"), false).unwrap();
        assert_eq!(l.endpoints, ["http://h:9"]);
    }

    #[test]
    fn a_scheme_chooses_tls_and_a_bare_endpoint_follows_the_certificates() {
        let l = parse("etcd:///j", Some("https://a:1,https://[::1]:2"), false).unwrap();
        assert_eq!(l.endpoints, ["https://a:1", "https://[::1]:2"]);
        assert!(l.tls());
        let l = parse("etcd://a:1,b:2/j", None, true).unwrap();
        assert_eq!(l.endpoints, ["https://a:1", "https://b:2"]);
        assert!(l.tls());
        // Written with its scheme in the URL too; the name starts after the endpoints.
        let l = parse("etcd://https://a:1,https://b:2/jobs/x", None, false).unwrap();
        assert_eq!(l.endpoints, ["https://a:1", "https://b:2"]);
        assert_eq!(l.name, "jobs/x");
        // An explicit http:// stays plain even with certificates configured.
        let l = parse("etcd://http://a:1/j", None, true).unwrap();
        assert!(!l.tls());
    }

    #[test]
    fn a_bad_endpoint_is_refused_naming_it_where_it_came_from_and_why() {
        for (env, what, why) in [
            ("ftp://a:1", "ftp://a:1", "scheme"),
            ("a", "\"a\"", "no port"),
            ("a:x", "a:x", "not a port"),
            ("a:0", "a:0", "not a port"),
            ("::1:2379", "::1:2379", "in brackets"),
            ("u@a:1", "u@a:1", "not a host"),
        ] {
            let e = parse("etcd:///j", Some(env), false)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(what) && e.contains("ETCDCTL_ENDPOINTS") && e.contains(why),
                "{env}: {e}"
            );
        }
        let e = parse("etcd://a:1,b/j", None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"b\"") && e.contains("the URL"), "{e}");
        let e = parse("etcd:///j", Some(" , "), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no endpoints"), "{e}");
    }

    #[test]
    fn job_records_are_under_no_lock_prefix_nor_under_another_locks_jobs() {
        let l = parse("etcd://a:1/jobs/nightly%x", None, false).unwrap();
        assert_eq!(l.jobs_prefix(), "leasehold:jobs:jobs%2Fnightly%25x:");
        assert_eq!(l.job_key(0x1f), "leasehold:jobs:jobs%2Fnightly%25x:1f");
        assert!(!l.job_key(0x1f).contains('/'));
        let a = parse("etcd://a:1/a", None, false).unwrap();
        let ab = parse("etcd://a:1/a:b", None, false).unwrap();
        assert!(!ab.job_key(1).starts_with(&a.jobs_prefix()));
    }

    #[test]
    fn a_url_without_a_lock_name_is_refused_saying_how() {
        for bad in ["etcd://h:2379", "etcd://h:2379/", "etcd://h:2379/a/"] {
            let e = EtcdLock::parse(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains("etcd://HOST:PORT/NAME"), "{bad}: {e}");
        }
    }
}
