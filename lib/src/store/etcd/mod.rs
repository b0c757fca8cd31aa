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
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::{Error, Result};

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
    /// `ETCDCTL_ENDPOINTS` (default `127.0.0.1:2379`, as etcdctl's).
    pub(crate) fn parse(url: &Path) -> Result<EtcdLock> {
        let bad = |why: &str| Error::Settings(format!("{}: {why}", url.display()));
        let s = url
            .to_str()
            .ok_or_else(|| bad("an etcd lock URL must be UTF-8"))?;
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("not an etcd:// URL"))?;
        let (hosts, name) = rest
            .split_once('/')
            .ok_or_else(|| bad("no lock name: use etcd://HOST:PORT/NAME"))?;
        if name.is_empty() || name.ends_with('/') {
            return Err(bad("no lock name: use etcd://HOST:PORT/NAME"));
        }
        let hosts = if hosts.is_empty() {
            std::env::var("ETCDCTL_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:2379".into())
        } else {
            hosts.to_string()
        };
        let tls = std::env::var_os("ETCDCTL_CACERT").is_some()
            || std::env::var_os("ETCDCTL_CERT").is_some();
        let endpoints: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                if h.starts_with("http://") || h.starts_with("https://") {
                    h.to_string()
                } else if tls {
                    format!("https://{h}")
                } else {
                    format!("http://{h}")
                }
            })
            .collect();
        if endpoints.is_empty() {
            return Err(bad(
                "no endpoints: use etcd://HOST:PORT/NAME or set ETCDCTL_ENDPOINTS",
            ));
        }
        Ok(EtcdLock {
            url: url.to_path_buf(),
            endpoints,
            name: name.to_string(),
        })
    }

    /// The prefix every contender's key lives under: `NAME/`.
    pub(crate) fn prefix(&self) -> String {
        format!("{}/", self.name)
    }

    /// The key of the contender holding etcd lease `lease` (etcd's recipe: the lease id in hex).
    pub(crate) fn key(&self, lease: i64) -> String {
        format!("{}/{lease:x}", self.name)
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

/// A connection to the cluster: the client and the runtime it runs on (current-thread: it runs
/// only while one of our calls waits on it).
pub(crate) struct Conn {
    pub lock: EtcdLock,
    rt: tokio::runtime::Runtime,
    client: Client,
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
        Ok(Conn { lock, rt, client })
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
            Err(_) => Err(self.lock.error(op, format!("no answer within {timeout:?}"))),
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
    let (ca, cert, key) = (
        read("ETCDCTL_CACERT")?,
        read("ETCDCTL_CERT")?,
        read("ETCDCTL_KEY")?,
    );
    if ca.is_some() || cert.is_some() {
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = ca {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(ca));
        }
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
    }
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
    fn a_url_without_a_lock_name_is_refused_saying_how() {
        for bad in ["etcd://h:2379", "etcd://h:2379/", "etcd://h:2379/a/"] {
            let e = EtcdLock::parse(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains("etcd://HOST:PORT/NAME"), "{bad}: {e}");
        }
    }
}
