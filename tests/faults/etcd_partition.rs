//! The etcd store under network partitions: a three-member cluster whose members, holder,
//! contender and an observer each live in a network namespace of their own ("hosts"), joined
//! by veth pairs to a bridge in a "switch" namespace, as the NFS lab isolates hosts. A
//! partition between two hosts is nftables dropping their packets both ways, silently (no
//! refusal: a cut-off peer just stops answering). Checked: a holder whose client reaches only
//! a member cut off from the other two (a follower, or the leader) fences (74) before its
//! lease expires on the majority side, and a contender there starts only after that, about a
//! TTL after the cut (plus an election when the leader was cut off); a holder
//! keeps its lease (exit 0 at its end, a contender on the majority side waiting for it) when
//! the leader, or one follower, is cut off from the others — whether the holder can still
//! reach that member or not. Built with the `etcd` feature; needs root, `ip`, `nft`, `etcd`
//! and `etcdctl` (skipped, failed under CI, without them).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::{self, Proc, code, ensure_within, wait_until};

/// The lease's timing in every case: TTL 3 s, renewed every 500 ms (grace 750 ms, margin
/// 150 ms: a holder that cannot renew fences 2.1 s after its last renewal began).
const TTL: Duration = Duration::from_secs(3);
const LEASE: [&str; 4] = ["--ttl", "3", "--heartbeat", "500ms"];

/// The holder's timing where it must keep its lease through a partition that leaves it a
/// quorum: TTL 6 s (it fences 4.2 s after its last renewal began). While the majority side
/// elects a new leader no member can renew anything; with six labs' clusters electing at once
/// on two CPUs that took more than the 2.1 s a 3 s TTL leaves (CI, 2026-12-03: fenced 2.19 s
/// after the cut). A TTL shorter than an election cannot be kept through one, by anybody.
const KEEP_TTL: Duration = Duration::from_secs(6);
const KEEP_LEASE: [&str; 4] = ["--ttl", "6", "--heartbeat", "500ms"];

/// Each lab's namespaces get a name of their own (several tests run at once).
static LABS: AtomicUsize = AtomicUsize::new(0);

/// The hosts: three members, the holder's, the contender's, and an observer's (never cut off,
/// for `etcdctl`).
const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];
const HOLDER: &str = "h";
const CONTENDER: &str = "c";
const OBSERVER: &str = "x";

fn ip_of(host: &str) -> &'static str {
    match host {
        "m0" => "10.77.0.1",
        "m1" => "10.77.0.2",
        "m2" => "10.77.0.3",
        "h" => "10.77.0.11",
        "c" => "10.77.0.12",
        _ => "10.77.0.10",
    }
}

/// Wall-clock time in nanoseconds since the epoch, as `date +%s%N` writes it.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos()
}

fn ms(ns: u128) -> f64 {
    ns as f64 / 1e6
}

/// Runs `prog ARGS` and panics unless it succeeds.
#[track_caller]
fn must(prog: &str, args: &[&str]) {
    let o = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e}"));
    assert!(
        o.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

struct Lab {
    /// The prefix of its namespaces' names.
    tag: String,
    dir: tempfile::TempDir,
    members: Vec<Proc>,
    made: Vec<String>,
}

impl Lab {
    /// The switch, the hosts and a healthy cluster; `None` (after saying why) where root or a
    /// tool is missing outside CI.
    #[track_caller]
    fn start() -> Option<Lab> {
        if support::need_root() {
            return None;
        }
        let missing: Vec<&str> = ["ip", "nft", "etcd", "etcdctl"]
            .into_iter()
            .filter(|t| !support::have(t))
            .collect();
        if support::skip(
            !missing.is_empty(),
            &format!(
                "missing {} (Debian: iproute2, nftables, etcd-server, etcd-client)",
                missing.join(", ")
            ),
        ) {
            return None;
        }
        let tag = format!(
            "lhpart{}n{}",
            std::process::id(),
            LABS.fetch_add(1, Ordering::Relaxed)
        );
        let mut lab = Lab {
            tag,
            dir: tempfile::tempdir().expect("a temporary directory"),
            members: Vec::new(),
            made: Vec::new(),
        };
        let sw = lab.ns("sw");
        must("ip", &["netns", "add", &sw]);
        lab.made.push(sw.clone());
        must("ip", &["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        must("ip", &["-n", &sw, "link", "set", "br0", "up"]);
        let hosts = MEMBERS.iter().chain(&[HOLDER, CONTENDER, OBSERVER]);
        for host in hosts {
            let ns = lab.ns(host);
            must("ip", &["netns", "add", &ns]);
            lab.made.push(ns.clone());
            let port = format!("v{host}");
            let veth = [
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ];
            must("ip", &veth);
            must(
                "ip",
                &["-n", &sw, "link", "set", &port, "master", "br0", "up"],
            );
            let addr = format!("{}/24", ip_of(host));
            must("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            must("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
            must("ip", &["-n", &ns, "link", "set", "lo", "up"]);
            lab.nft(
                host,
                "add table inet lh; \
                 add chain inet lh in { type filter hook input priority 0; }; \
                 add chain inet lh out { type filter hook output priority 0; }",
            );
        }
        let initial: Vec<String> = MEMBERS
            .iter()
            .map(|m| format!("{m}=http://{}:2380", ip_of(m)))
            .collect();
        for m in MEMBERS {
            let mut c = lab.exec_in(m, "etcd");
            let (client, peer) = (
                format!("http://{}:2379", ip_of(m)),
                format!("http://{}:2380", ip_of(m)),
            );
            let data = lab.dir.path().join(m);
            let log = lab.dir.path().join(format!("{m}.log"));
            c.args(["--name", m, "--data-dir"])
                .arg(&data)
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-token", &lab.tag])
                .args(["--initial-cluster-state", "new"])
                // As tests/support/etcd.rs: elections within about a second.
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--logger", "zap", "--log-outputs"])
                .arg(&log)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            lab.members
                .push(Proc::spawn(c, "etcd member (in its namespace)"));
        }
        let healthy = wait_until(Duration::from_secs(30), || {
            lab.etcdctl(&MEMBERS)
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(healthy, "the cluster did not become healthy within 30 s");
        Some(lab)
    }

    fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.tag)
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// `prog` run in `host`'s namespace (`ip netns exec` execs it: the pid is its own).
    fn exec_in(&self, host: &str, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(host)])
            .arg(prog)
            .stdin(Stdio::null());
        c
    }

    /// nft `cmds` in `host`'s namespace.
    #[track_caller]
    fn nft(&self, host: &str, cmds: &str) {
        must("ip", &["netns", "exec", &self.ns(host), "nft", cmds]);
    }

    /// Cuts `a` and `b` apart: each drops every packet from and to the other, silently.
    fn cut(&self, a: &str, b: &str) {
        for (me, other) in [(a, b), (b, a)] {
            let o = ip_of(other);
            self.nft(
                me,
                &format!(
                    "add rule inet lh in ip saddr {o} drop; add rule inet lh out ip daddr {o} drop"
                ),
            );
        }
    }

    /// `etcdctl` on `members`, from the observer's namespace.
    fn etcdctl(&self, members: &[&str]) -> Command {
        let eps: Vec<String> = members
            .iter()
            .map(|m| format!("http://{}:2379", ip_of(m)))
            .collect();
        let mut c = self.exec_in(OBSERVER, "etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", eps.join(",")))
            .arg("--command-timeout=2s");
        c
    }

    /// The member that `members` say leads (by their own status), if they agree on one.
    fn leader_among(&self, members: &[&str]) -> Option<usize> {
        let out = self
            .etcdctl(members)
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let arr = v.as_array()?;
        if arr.len() != members.len() {
            return None;
        }
        let leaders: Vec<u64> = arr
            .iter()
            .map(|m| m["Status"]["leader"].as_u64())
            .collect::<Option<_>>()?;
        if leaders.iter().any(|l| *l != leaders[0] || *l == 0) {
            return None;
        }
        let at = arr
            .iter()
            .position(|m| m["Status"]["header"]["member_id"].as_u64() == Some(leaders[0]))?;
        MEMBERS.iter().position(|m| *m == members[at])
    }

    /// The leader, once every member agrees on it.
    fn leader(&self) -> usize {
        let mut found = None;
        ensure_within(
            "the members to agree on a leader",
            Duration::from_secs(10),
            || {
                found = self.leader_among(&MEMBERS);
                found.is_some()
            },
        );
        found.unwrap()
    }

    /// The lock URL with `members`' endpoints, in that order.
    fn url(&self, members: &[&str], name: &str) -> String {
        let eps: Vec<String> = members
            .iter()
            .map(|m| format!("{}:2379", ip_of(m)))
            .collect();
        format!("etcd://{}/{name}", eps.join(","))
    }

    /// `leasehold run LEASE FLAGS URL -- sh -c SCRIPT` in `host`'s namespace, in a process
    /// group of its own, stderr piped.
    fn run_in(&self, host: &str, flags: &[&str], url: &str, script: &str) -> Proc {
        self.run_timed(host, &LEASE, flags, url, script)
    }

    /// [`Lab::run_in`] with the lease's timing `lease`.
    fn run_timed(
        &self,
        host: &str,
        lease: &[&str],
        flags: &[&str],
        url: &str,
        script: &str,
    ) -> Proc {
        let mut c = self.exec_in(host, support::bin());
        c.arg("run")
            .args(lease)
            .args(flags)
            .args([url, "--", "sh", "-c", script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: default_signals only calls signal(2), which is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                support::default_signals();
                Ok(())
            });
        }
        Proc::spawn(c, &format!("leasehold run in {host}'s namespace"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.members.clear();
        for ns in self.made.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A job that writes the time (`date +%s%N`) to `DIR/NAME-in` as it starts, then appends it to
/// `DIR/NAME-ticks` every 20 ms until it is killed, or, with `go`, until a line can be read
/// from the FIFO `DIR/go-NAME` (made here).
fn ticking_job(dir: &Path, name: &str, go: bool) -> String {
    let d = dir.display();
    let tick = format!("date +%s%N >> {d}/{name}-ticks");
    let start = format!("date +%s%N > {d}/{name}-in.part; mv {d}/{name}-in.part {d}/{name}-in");
    if go {
        let fifo = dir.join(format!("go-{name}"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // The reader runs beside the ticks; the job ends when it has read its line.
        format!(
            "{start}; {tick}; (read x < {f}) & r=$!; \
             while kill -0 $r 2>/dev/null; do {tick}; sleep 0.02; done; {tick}",
            f = fifo.display()
        )
    } else {
        format!("{start}; while :; do {tick}; sleep 0.02; done")
    }
}

/// A job that writes the time to `DIR/NAME-in` and ends.
fn stamp_job(dir: &Path, name: &str) -> String {
    let d = dir.display();
    format!("date +%s%N > {d}/{name}-in.part; mv {d}/{name}-in.part {d}/{name}-in")
}

/// A timestamp a job wrote to `path`.
fn stamp(path: &Path) -> u128 {
    let s = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {s:?}: {e}", path.display()))
}

/// Every tick a job wrote (none if it wrote none).
fn ticks(dir: &Path, name: &str) -> Vec<u128> {
    fs::read_to_string(dir.join(format!("{name}-ticks")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Case 1: the holder's client reaches only member `a` (first in its URL), and `a` is cut off
/// from the other two; a contender on the majority side (it cannot reach `a`) waits. The
/// holder must fence (74) before its lease can expire there, and the contender's command must
/// start only after the holder's ended, about a TTL after the cut (the leader on the majority
/// side counts the lease down from the holder's last keepalive; a new leader, when `a` led,
/// gives it a whole TTL again when elected).
fn minority_holder_fences_first(which: Isolated) {
    let Some(lab) = Lab::start() else { return };
    let dir = lab.path();
    let leader = lab.leader();
    let a = match which {
        Isolated::Leader => MEMBERS[leader],
        Isolated::Follower => MEMBERS[(leader + 1) % 3],
    };
    let others: Vec<&str> = MEMBERS.iter().copied().filter(|m| *m != a).collect();
    let url_h = lab.url(&[a, others[0], others[1]], "part");
    let mut h = lab.run_in(HOLDER, &[], &url_h, &ticking_job(&dir, "h", false));
    ensure_within("the holder's job to start", Duration::from_secs(20), || {
        dir.join("h-in").exists()
    });
    // Let it renew a few times on `a` before the cut.
    ensure_within("the holder's job to tick", Duration::from_secs(5), || {
        ticks(&dir, "h").len() >= 25
    });
    for o in &others {
        lab.cut(a, o);
        lab.cut(HOLDER, o);
    }
    lab.cut(CONTENDER, a);
    let cut = now_ns();
    // The contender tries the majority members first; `a` (last) only drops its packets.
    let url_c = lab.url(&[others[0], others[1], a], "part");
    let mut c = lab.run_in(CONTENDER, &["-w", "30"], &url_c, &stamp_job(&dir, "c"));
    // Both watched at once, every 2 ms: when the holder's wrapper was seen gone (its command is
    // dead before it exits), and when the contender's command started (its own stamp).
    let mut h_exit = None;
    let both = wait_until(Duration::from_secs(20), || {
        if h_exit.is_none() {
            h_exit = h.try_wait().map(|st| (code(st), now_ns()));
        }
        h_exit.is_some() && dir.join("c-in").exists()
    });
    assert!(
        both,
        "20 s after the cut: the holder {}, the contender's command {}",
        h_exit.map_or("still runs (never fenced)".to_string(), |(rc, _)| format!(
            "exited {rc}"
        )),
        if dir.join("c-in").exists() {
            "started"
        } else {
            "did not start"
        }
    );
    let (h_rc, h_gone) = h_exit.unwrap();
    let c_in = stamp(&dir.join("c-in"));
    let last_tick = ticks(&dir, "h").into_iter().max().unwrap();
    assert_eq!(h_rc, 74, "the cut-off holder must fence: {}", h.stderr());
    let (fenced, took_over) = (h_gone - cut, c_in.saturating_sub(cut));
    println!(
        "etcd partition, holder with a minority member ({a}, {}): fenced (74) \
         {:.0} ms after the cut, last tick at {:.0} ms; the majority-side contender's command \
         started {:.0} ms after the cut ({:.0} ms after the holder was gone; TTL 3 s)",
        which.name(),
        ms(fenced),
        ms(last_tick.saturating_sub(cut)),
        ms(took_over),
        ms(c_in.saturating_sub(h_gone)),
    );
    let st = c.wait_timeout(Duration::from_secs(10));
    assert_eq!(code(st), 0, "the contender: {}", c.stderr());
    assert!(
        h_gone < c_in && last_tick < c_in,
        "overlap: the contender's command started at {c_in}, the holder was seen gone at \
         {h_gone}, its job's last tick at {last_tick}"
    );
    assert!(
        fenced < TTL.as_nanos(),
        "the holder fenced {:.0} ms after the cut: not within its TTL",
        ms(fenced)
    );
    // The lease expires on the majority side a TTL after the holder's last keepalive there,
    // sent at most a heartbeat (plus a renewal's time) before the cut.
    assert!(
        took_over >= (TTL - Duration::from_millis(1000)).as_nanos()
            && took_over < (TTL + Duration::from_secs(4)).as_nanos(),
        "the contender took over {:.0} ms after the cut: not about a TTL (3 s)",
        ms(took_over)
    );
}

#[test]
fn etcd_partition_holder_reaching_only_a_cut_off_follower_fences_before_the_majority_side_takes_over()
 {
    minority_holder_fences_first(Isolated::Follower);
}

#[test]
fn etcd_partition_holder_reaching_only_a_cut_off_leader_fences_before_the_majority_side_takes_over()
{
    minority_holder_fences_first(Isolated::Leader);
}

/// Which member is cut off from the other two.
#[derive(Clone, Copy, PartialEq)]
enum Isolated {
    Leader,
    Follower,
}

impl Isolated {
    fn name(self) -> &'static str {
        match self {
            Isolated::Leader => "the leader",
            Isolated::Follower => "a follower",
        }
    }
}

/// Cases 2 and 3: member `which` is cut off from the other two (and from the contender); the
/// holder's client talks to it (first in its URL) when the cut comes, and, if `reach`, can still
/// reach it afterwards (else it is cut from the holder too). The holder ([`KEEP_TTL`]) keeps
/// its lease through two TTLs: its job ticks on, a contender on the majority side waits, and after the holder's
/// command is let go it exits 0 and only then does the contender's command start.
fn holder_keeps_its_lease(which: Isolated, reach: bool) {
    let Some(lab) = Lab::start() else { return };
    let dir = lab.path();
    let leader = lab.leader();
    let lone = match which {
        Isolated::Leader => MEMBERS[leader],
        Isolated::Follower => MEMBERS[(leader + 1) % 3],
    };
    let others: Vec<&str> = MEMBERS.iter().copied().filter(|m| *m != lone).collect();
    let url = lab.url(&[lone, others[0], others[1]], "part");
    let mut h = lab.run_timed(
        HOLDER,
        &KEEP_LEASE,
        &[],
        &url,
        &ticking_job(&dir, "h", true),
    );
    ensure_within("the holder's job to start", Duration::from_secs(20), || {
        dir.join("h-in").exists()
    });
    ensure_within("the holder's job to tick", Duration::from_secs(5), || {
        ticks(&dir, "h").len() >= 25
    });
    for o in &others {
        lab.cut(lone, o);
    }
    if !reach {
        lab.cut(HOLDER, lone);
    }
    lab.cut(CONTENDER, lone);
    let cut = Instant::now();
    let url_c = lab.url(&[others[0], others[1], lone], "part");
    let mut c = lab.run_in(CONTENDER, &["-w", "60"], &url_c, &stamp_job(&dir, "c"));
    // The majority side leads (a new leader when the old one was cut off).
    let mut new_leader = None;
    let led = wait_until(Duration::from_secs(10), || {
        new_leader = lab.leader_among(&others);
        new_leader.is_some()
    });
    let elected = cut.elapsed();
    assert!(led, "the two members left did not agree on a leader");
    // Two of its TTLs from the cut: the holder is never fenced, the contender never starts.
    let hold = KEEP_TTL * 2;
    while cut.elapsed() < hold {
        if let Some(st) = h.wait_within(Duration::from_millis(100)) {
            panic!(
                "the holder ended ({}) {:?} after the cut (the majority side had a leader \
                 {elected:?} after it): {}",
                code(st),
                cut.elapsed(),
                h.stderr()
            );
        }
        assert!(
            !dir.join("c-in").exists(),
            "the contender's command started while the holder held"
        );
        if let Some(st) = c.try_wait() {
            panic!(
                "the contender ended ({}) while the holder held: {}",
                code(st),
                c.stderr()
            );
        }
    }
    let last_before = ticks(&dir, "h").into_iter().max().unwrap();
    assert!(
        now_ns() - last_before < Duration::from_secs(1).as_nanos(),
        "the holder's job stopped ticking"
    );
    fs::write(dir.join("go-h"), "go\n").unwrap();
    let st = h.wait_timeout(Duration::from_secs(10));
    let h_gone = now_ns();
    assert_eq!(
        code(st),
        0,
        "the holder must keep its lease: {}",
        h.stderr()
    );
    ensure_within(
        "the contender's command to start",
        Duration::from_secs(10),
        || dir.join("c-in").exists(),
    );
    let c_in = stamp(&dir.join("c-in"));
    let last_tick = ticks(&dir, "h").into_iter().max().unwrap();
    assert!(
        last_tick < c_in && h_gone > 0,
        "overlap: the holder's job ticked at {last_tick}, after the contender's start {c_in}"
    );
    println!(
        "etcd partition, {} ({lone}) cut off from the other members ({}): the majority side \
         agreed on leader {} after {elected:?}; the holder kept its lease for {hold:?} after \
         the cut and exited 0; the waiting contender's command started {:.0} ms after the \
         holder's job ended",
        which.name(),
        if reach {
            "the holder still reaching it"
        } else {
            "and from the holder"
        },
        new_leader.map_or("?", |i| MEMBERS[i]),
        ms(c_in.saturating_sub(last_tick)),
    );
    let st = c.wait_timeout(Duration::from_secs(10));
    assert_eq!(code(st), 0, "the contender: {}", c.stderr());
}

#[test]
fn etcd_partition_leader_cut_off_from_the_followers_holder_reaching_all_keeps_its_lease() {
    holder_keeps_its_lease(Isolated::Leader, true);
}

#[test]
fn etcd_partition_leader_cut_off_from_everyone_holder_reaching_the_followers_keeps_its_lease() {
    holder_keeps_its_lease(Isolated::Leader, false);
}

#[test]
fn etcd_partition_follower_cut_off_from_the_others_holder_reaching_all_keeps_its_lease() {
    holder_keeps_its_lease(Isolated::Follower, true);
}

#[test]
fn etcd_partition_follower_cut_off_from_everyone_holder_reaching_the_others_keeps_its_lease() {
    holder_keeps_its_lease(Isolated::Follower, false);
}
