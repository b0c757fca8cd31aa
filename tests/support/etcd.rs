//! A real etcd cluster for the etcd store's tests: [`Cluster`], three members on loopback
//! ports (Debian's `etcd-server`), with `etcdctl` (`etcd-client`) to look at it and to take
//! `etcdctl lock` on it. Started by [`Cluster::start`] (which skips — fails under CI — where
//! the binaries are missing) and torn down on drop: every member is SIGCONTed, SIGKILLed and
//! reaped, and its data directory removed. [`Cluster::start_tls`] makes one that serves
//! clients over TLS only (a CA and a server certificate made with `openssl`), with
//! authentication on: `root:rootpw`, and `lh:secret`, who may read and write only under `tls/`.
//! [`Cluster::start_mtls`] makes one that serves clients over TLS and demands a client
//! certificate signed by the same CA (`--client-cert-auth`; `client.pem`, `client.key`).
//! A member killed ([`Cluster::kill_member`]) starts again on its data directory with
//! [`Cluster::restart_member`]; [`free_port`] gives a loopback port nothing listens on.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::env::{have, skip};
use super::proc::Proc;
use super::wait::wait_until;

/// One member: its process and client port.
pub struct Member {
    pub name: String,
    pub client: u16,
    pub proc: Option<Proc>,
    /// Its command line, to start it again on its data directory ([`Cluster::restart_member`]).
    pub args: Vec<std::ffi::OsString>,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub members: Vec<Member>,
    /// Clients over TLS, with users (see [`Cluster::start_tls`]).
    pub tls: bool,
    /// Clients over TLS with client certificates (see [`Cluster::start_mtls`]).
    pub mtls: bool,
}

/// Runs `openssl ARGS` in `dir`, panicking on failure.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(st.success(), "openssl {args:?} failed");
}

/// A CA (`ca.pem`), a server certificate for 127.0.0.1 (`server.pem`, `server.key`) and a
/// client certificate (`client.pem`, `client.key`), both signed by the CA.
fn make_certs(dir: &std::path::Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509"];
    a.extend(ec);
    a.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=lh-test-ca",
    ]);
    openssl(dir, &a);
    let mut a = vec!["req"];
    a.extend(ec);
    a.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(dir, &a);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    let mut a = vec!["req"];
    a.extend(ec);
    a.extend([
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=lh-client",
    ]);
    openssl(dir, &a);
    std::fs::write(dir.join("client.cnf"), "extendedKeyUsage=clientAuth\n").unwrap();
    sign(dir, "client", "client.cnf");
    sign(dir, "server", "ext.cnf");
}

/// Signs `NAME.csr` with the test CA into `NAME.pem`, valid two days, with the extensions of
/// `EXT` (a file in `dir`).
fn sign(dir: &std::path::Path, name: &str, ext: &str) {
    let (csr, pem) = (format!("{name}.csr"), format!("{name}.pem"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    );
}

/// A free loopback port (bound, then released for a member to take; or, left alone, a port
/// where connecting is refused). Never one this process handed out before: clusters start side
/// by side in parallel tests. Below the kernel's ephemeral range (32768 and up by default): a
/// port from `bind(…:0)` is one an outgoing connection (a member's to its peers) can take in
/// the moment before the member binds it, and a member that cannot bind its port leaves its
/// cluster unhealthy (a CI run failed so once).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const FIRST: u16 = 20_000;
    const SPAN: u16 = 12_000;
    // Each process starts at its own place in the span.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % u32::from(SPAN)) as u16;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + (start + n % SPAN) % SPAN;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}

/// The command line of member `name` (client port, peer port) of a new cluster.
fn member_cmd(
    dir: &std::path::Path,
    name: &str,
    (c, p): (u16, u16),
    initial: &str,
    token: &str,
    (tls, mtls): (bool, bool),
) -> Command {
    let scheme = if tls { "https" } else { "http" };
    let mut cmd = Command::new("etcd");
    cmd.args([
        "--name",
        name,
        "--data-dir",
        dir.join(name).to_str().unwrap(),
        "--listen-client-urls",
        &format!("{scheme}://127.0.0.1:{c}"),
        "--advertise-client-urls",
        &format!("{scheme}://127.0.0.1:{c}"),
        "--listen-peer-urls",
        &format!("http://127.0.0.1:{p}"),
        "--initial-advertise-peer-urls",
        &format!("http://127.0.0.1:{p}"),
        "--initial-cluster",
        initial,
        "--initial-cluster-token",
        token,
        "--initial-cluster-state",
        "new",
        "--heartbeat-interval",
        "50",
        "--election-timeout",
        "500",
        "--logger",
        "zap",
        "--log-outputs",
        dir.join(format!("{name}.log")).to_str().unwrap(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if tls {
        let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
        cmd.args([
            "--cert-file",
            &p("server.pem"),
            "--key-file",
            &p("server.key"),
        ]);
        // Server TLS only, unless `mtls`: a trusted CA file demands client certificates.
        if mtls {
            cmd.args(["--client-cert-auth", "--trusted-ca-file", &p("ca.pem")]);
        }
    }
    cmd
}

impl Cluster {
    /// A fresh three-member cluster, healthy; `None` (after saying why) where `etcd` or
    /// `etcdctl` is missing outside CI.
    #[track_caller]
    pub fn start() -> Option<Cluster> {
        Cluster::start_with(false, false)
    }

    /// A fresh cluster serving clients over TLS only, with authentication on (see the module).
    #[track_caller]
    pub fn start_tls() -> Option<Cluster> {
        Cluster::start_with(true, false)
    }

    /// A fresh cluster serving clients over TLS only, demanding a client certificate signed
    /// by its CA (`--client-cert-auth`), without users.
    #[track_caller]
    pub fn start_mtls() -> Option<Cluster> {
        Cluster::start_with(true, true)
    }

    #[track_caller]
    fn start_with(tls: bool, mtls: bool) -> Option<Cluster> {
        if skip(
            !have("etcd") || !have("etcdctl") || (tls && !have("openssl")),
            "etcd/etcdctl/openssl missing (Debian: etcd-server, etcd-client, openssl)",
        ) {
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        if tls {
            make_certs(dir.path());
        }
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let token = format!("lh-{}-{}", std::process::id(), ports[0].0);
        let mut members = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let cmd = member_cmd(
                dir.path(),
                &name,
                (*c, *p),
                &initial.join(","),
                &token,
                (tls, mtls),
            );
            let args = cmd.get_args().map(ToOwned::to_owned).collect();
            members.push(Member {
                name,
                client: *c,
                proc: Some(Proc::spawn(cmd, "etcd member")),
                args,
            });
        }
        let cluster = Cluster {
            dir,
            members,
            tls,
            mtls,
        };
        let healthy = wait_until(Duration::from_secs(30), || {
            cluster
                .etcdctl_as(None)
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(
            healthy,
            "the etcd cluster did not become healthy within 30 s"
        );
        if tls && !mtls {
            cluster.enable_auth();
        }
        Some(cluster)
    }

    /// Users `root:rootpw` and `lh:secret` (read-write under `tls/` only), then auth on.
    fn enable_auth(&self) {
        let steps: &[&[&str]] = &[
            &["role", "add", "root"],
            &["user", "add", "root:rootpw"],
            &["user", "grant-role", "root", "root"],
            &["role", "add", "lh"],
            &[
                "role",
                "grant-permission",
                "lh",
                "--prefix=true",
                "readwrite",
                "tls/",
            ],
            &["user", "add", "lh:secret"],
            &["user", "grant-role", "lh", "lh"],
            &["auth", "enable"],
        ];
        for step in steps {
            let mut c = self.etcdctl_as(None);
            c.args(*step).stdout(Stdio::null());
            let st = c.status().expect("etcdctl");
            assert!(st.success(), "etcdctl {step:?} failed");
        }
        // Every member applies `auth enable` on its own time: wait until each authenticates.
        for m in &self.members {
            let on = wait_until(Duration::from_secs(10), || {
                Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints=https://127.0.0.1:{}", m.client))
                    .arg(format!("--cacert={}", self.path().join("ca.pem").display()))
                    .args(["--user=lh:secret", "get", "tls/probe"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            });
            assert!(on, "member {} did not enable authentication", m.name);
        }
    }

    /// The client URLs, with their scheme.
    pub fn client_urls(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `127.0.0.1:C0,127.0.0.1:C1,127.0.0.1:C2`.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The URL of lock `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("etcd://{}/{name}", self.endpoints())
    }

    /// The URL of lock `name` with member `first`'s endpoint first (the one a client talks to
    /// while it answers), the others after it in order.
    pub fn url_first(&self, first: usize, name: &str) -> String {
        let n = self.members.len();
        let eps: Vec<String> = (0..n)
            .map(|k| format!("127.0.0.1:{}", self.members[(first + k) % n].client))
            .collect();
        format!("etcd://{}/{name}", eps.join(","))
    }

    /// `etcdctl` on every member (as root, on a TLS cluster with users).
    pub fn etcdctl(&self) -> Command {
        self.etcdctl_as((self.tls && !self.mtls).then_some("root:rootpw"))
    }

    /// `etcdctl` on every member, as `user` (`name:password`) if given.
    pub fn etcdctl_as(&self, user: Option<&str>) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.client_urls()))
            .stdin(Stdio::null());
        if self.tls {
            c.arg(format!("--cacert={}", self.path().join("ca.pem").display()));
        }
        if self.mtls {
            c.arg(format!(
                "--cert={}",
                self.path().join("client.pem").display()
            ));
            c.arg(format!(
                "--key={}",
                self.path().join("client.key").display()
            ));
        }
        if let Some(u) = user {
            c.arg(format!("--user={u}"));
        }
        c
    }

    /// The keys under `prefix`, in line order of the lock recipe (by create revision), as
    /// `etcdctl get --prefix --sort-by=CREATE --keys-only` prints them.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let out = self
            .etcdctl()
            .args(["get", "--prefix", "--keys-only", "--sort-by=CREATE", prefix])
            .output()
            .expect("etcdctl get");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The index of the member that leads now.
    pub fn leader(&self) -> usize {
        let out = self
            .etcdctl()
            .args(["endpoint", "status", "-w", "json"])
            .output()
            .expect("etcdctl endpoint status");
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("endpoint status as JSON");
        let arr = v.as_array().expect("an array of members");
        arr.iter()
            .position(|m| {
                m["Status"]["header"]["member_id"] == m["Status"]["leader"]
                    && m["Status"]["leader"].is_u64()
            })
            .expect("a leader")
    }

    /// Sends `sig` to every live member.
    pub fn signal_all(&self, sig: Signal) {
        for m in &self.members {
            if let Some(p) = &m.proc {
                let _ = kill(Pid::from_raw(p.pid()), sig);
            }
        }
    }

    /// SIGKILLs member `i` (reaped by its `Proc`'s drop).
    pub fn kill_member(&mut self, i: usize) {
        drop(self.members[i].proc.take());
    }

    /// Starts member `i` again (killed by [`Cluster::kill_member`]) on its data directory, and
    /// waits until the whole cluster is healthy.
    #[track_caller]
    pub fn restart_member(&mut self, i: usize) {
        let mut cmd = Command::new("etcd");
        cmd.args(&self.members[i].args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.members[i].proc = Some(Proc::spawn(cmd, "etcd member (restarted)"));
        let healthy = wait_until(Duration::from_secs(30), || {
            self.etcdctl_as(None)
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(healthy, "member {i} did not rejoin within 30 s");
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.signal_all(Signal::SIGCONT);
        for m in &mut self.members {
            drop(m.proc.take());
        }
    }
}
