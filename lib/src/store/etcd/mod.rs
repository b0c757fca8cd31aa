//! The etcd store: leases on an etcd cluster, for `etcd://HOST:PORT[,HOST:PORT...]/NAME` locks.
//!
//! Owns: naming an etcd lock (its URL, endpoints and key prefix, [`EtcdLock`]), the connection
//! to the cluster with TLS and a user from the `ETCDCTL_*` environment ([`Conn`]: a client on a
//! small current-thread runtime owned by the connection, built only for an etcd lock), and the
//! typed errors that name the endpoints and the cause. The lock recipe itself (etcd's own, so
//! that `etcdctl lock NAME` and leasehold exclude each other) is in `acquire.rs`, the held
//! lease in `holding.rs`, `status` and `break` in `look.rs`; PROTOCOL.md §14 states the layout
//! and the safety argument.
//! Must never: start a runtime or a thread for a lock that is not etcd's; install a
//! process-global handler; wait on the cluster without a deadline.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::{Error, Result};
use crate::paths::LockPaths;
use crate::process::JobEvidence;
use crate::record::Lease;
use crate::store::binding::Binding;

pub(crate) mod acquire;
pub(crate) mod holding;
pub(crate) mod look;

/// The URL scheme of an etcd lock.
pub(crate) const SCHEME: &str = "etcd://";

/// How long connecting (and any one request outside a wait) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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

    /// The prefix every contender's key lives under: `NAME/`.
    pub(crate) fn prefix(&self) -> String {
        format!("{}/", self.name)
    }

    /// The key of the contender holding etcd lease `lease` (etcd's recipe: the lease id in hex).
    pub(crate) fn key(&self, lease: i64) -> String {
        format!("{}/{lease:x}", self.name)
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

    /// An error talking to the cluster while doing `op`: names the endpoints and the cause.
    pub(crate) fn error(&self, op: &'static str, cause: impl std::fmt::Display) -> Error {
        Error::io(
            &self.url,
            op,
            std::io::Error::other(format!("etcd at {}: {cause}", self.endpoints.join(","))),
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

/// A connection to the cluster: the client and the runtime it runs on (current-thread: it runs
/// only while one of our calls waits on it).
pub(crate) struct Conn {
    pub lock: EtcdLock,
    rt: tokio::runtime::Runtime,
    client: Client,
    /// Whether job records are kept and read (false once the cluster said our user may not
    /// touch `leasehold:jobs:`; the remnant rule at takeover then cannot apply, PROTOCOL §14).
    jobs: AtomicBool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("lock", &self.lock).finish()
    }
}

impl Conn {
    /// Connects to the lock's endpoints, with TLS and a user as the `ETCDCTL_*` environment
    /// says.
    pub(crate) fn connect(lock: EtcdLock) -> Result<Conn> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io(&lock.url, "start the etcd client's runtime", e))?;
        let opts = options(&lock)?;
        let eps = lock.endpoints.clone();
        let client = rt
            .block_on(async {
                tokio::time::timeout(CALL_TIMEOUT, Client::connect(eps, Some(opts))).await
            })
            .map_err(|_| lock.error("connect", "timed out"))?
            .map_err(|e| lock.error("connect", e))?;
        Ok(Conn {
            lock,
            rt,
            client,
            jobs: AtomicBool::new(true),
        })
    }

    /// Whether this connection keeps and reads job records ([`EtcdLock::jobs_prefix`]).
    pub(crate) fn keeps_jobs(&self) -> bool {
        self.jobs.load(Ordering::Relaxed)
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

    /// A fresh handle on the client (cheap: it shares the connection).
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// Runs `f` on the runtime, at most `timeout`; errors name the endpoints, `op` and cause.
    pub(crate) fn call<T>(
        &self,
        op: &'static str,
        timeout: Duration,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        // The timer is made inside the runtime (outside, tokio has no timer to give it).
        match self
            .rt
            .block_on(async { tokio::time::timeout(timeout, f).await })
        {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(self.lock.error(op, e)),
            Err(_) => Err(Error::io(
                &self.lock.url,
                op,
                no_answer(&self.lock.endpoints, timeout),
            )),
        }
    }

    /// [`Conn::call`] with the default timeout.
    pub(crate) fn run<T>(
        &self,
        op: &'static str,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        self.call(op, CALL_TIMEOUT, f)
    }

    /// Runs `f` on the runtime (for waits that keep their own deadline).
    pub(crate) fn block_on<T>(&self, f: impl Future<Output = T>) -> T {
        self.rt.block_on(f)
    }
}

/// `etcd at ENDPOINTS: no answer within 833ms`: a call that timed out, its bound in leasehold's
/// own duration form (never Rust's `833.333333ms`).
fn no_answer(endpoints: &[String], timeout: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "etcd at {}: no answer within {}",
            endpoints.join(","),
            crate::human_duration(timeout)
        ),
    )
}

/// When `e` says the cluster cannot serve us for now (no leader: an election, a cluster just
/// resumed; a request dropped by a change of leader; no answer in time), how to say so after
/// "the etcd cluster, which ..."; `None` for every other error. The one home of this check.
pub(crate) fn unavailable(e: &Error) -> Option<&'static str> {
    let io = e.io_error()?;
    if io.kind() == std::io::ErrorKind::TimedOut {
        return Some("did not answer in time");
    }
    let m = io.to_string();
    if m.contains("no leader") {
        Some("has no leader yet")
    } else if m.contains("leader changed") || m.contains("request timed out") {
        Some("is changing its leader")
    } else {
        None
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
        assert_eq!(l.prefix(), "jobs/nightly/");
        // etcd's concurrency.Mutex: fmt.Sprintf("%s%x", pfx, leaseID).
        assert_eq!(l.key(0x694d_7d1f), "jobs/nightly/694d7d1f");
    }

    #[test]
    fn a_call_without_an_answer_says_its_bound_rounded() {
        let e = no_answer(&["http://h:2379".into()], Duration::from_nanos(833_333_333));
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(
            e.to_string(),
            format!(
                "etcd at http://h:2379: no answer within {}",
                crate::human_duration(Duration::from_millis(833))
            )
        );
        assert!(!e.to_string().contains("833.3"), "{e}");
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
