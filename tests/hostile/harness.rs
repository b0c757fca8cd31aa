//! Harness for the multi-user tests (`multiuser.rs`): throwaway users and a group, leasehold
//! run as them through `setpriv` with a chosen umask (their jobs checked by the
//! shared critical-section checker, `support::cs`), bystander processes that record any signal they receive, snapshots of
//! planted files, and a guard that turns the kernel's link protections off for an attack test.
//!
//! Everything is removed on drop, even when a test panics: the users' processes are SIGKILLed (by
//! pid, found in /proc by real uid), the users and the group deleted, the temp tree removed.
//!
//! [`Scene`] bundles what every multi-user test starts with (its name, the skip check, a world,
//! bystanders, a failure list and a critical-section checker) and ends with (no overlap, no
//! bystander touched, no failure).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Display;

use crate::support::{self, Cs, have};
pub use crate::support::{Outcome, Proc, is_dead, start_time, wait_until};
use std::fs;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Returns true (skip) when not root or a tool is missing, saying why; fails instead when `CI` is
/// set (CI runs as root and must run these tests).
#[track_caller]
pub fn skip(test: &str) -> bool {
    let mut why: Vec<String> = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        why.push("needs root (creates users and a group, runs leasehold as them)".to_string());
    }
    for tool in [
        "setpriv", "useradd", "userdel", "groupadd", "groupdel", "flock", "sh", "date", "sleep",
    ] {
        if !have(tool) {
            why.push(format!(
                "missing tool {tool} (Debian: util-linux, passwd, coreutils)"
            ));
        }
    }
    if why.is_empty() {
        return false;
    }
    support::skip(true, &format!("{test}: {}", why.join("; ")))
}

/// Serialises user and group management (useradd locks /etc/passwd and fails when it cannot).
static ACCOUNTS: Mutex<()> = Mutex::new(());
static SERIAL: AtomicU32 = AtomicU32::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs an account command, retrying while another process holds the passwd lock.
fn account(args: &[&str]) {
    let _g = lock(&ACCOUNTS);
    let mut last = String::new();
    for _ in 0..50 {
        let out = Command::new(args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
        if out.status.success() {
            return;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        // 10 = cannot lock /etc/passwd or /etc/group (another useradd runs): try again.
        if out.status.code() != Some(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{args:?} failed: {last}");
}

#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Who runs a command: root, or one of the throwaway users.
#[derive(Debug, Clone, Copy)]
pub enum Who<'a> {
    Root,
    User(&'a User),
}

impl Who<'_> {
    pub fn name(&self) -> String {
        match self {
            Who::Root => "root".into(),
            Who::User(u) => u.name.clone(),
        }
    }
    pub fn uid(&self) -> u32 {
        match self {
            Who::Root => 0,
            Who::User(u) => u.uid,
        }
    }
}

/// One test's world: a 0755 temp tree outside /root holding a copy of the leasehold binary, a
/// throwaway group and two (or more) members of it, and the processes started as them.
pub struct World {
    pub base: PathBuf,
    pub bin: PathBuf,
    pub group: String,
    pub gid: u32,
    pub a: User,
    pub b: User,
    pub c: User,
    users: Vec<User>,
    _tmp: tempfile::TempDir,
}

impl World {
    pub fn new() -> World {
        let n = SERIAL.fetch_add(1, Ordering::SeqCst);
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(sweep_stale_accounts);
        let tag = format!("lh{}x{}", std::process::id(), n);
        let tmp = tempfile::Builder::new()
            .prefix("leasehold-multiuser-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let base = tmp.path().to_path_buf();
        chmod(&base, 0o755);
        fs::create_dir(base.join("bin")).unwrap();
        chmod(&base.join("bin"), 0o755);
        let bin = base.join("bin/leasehold");
        fs::copy(env!("CARGO_BIN_EXE_leasehold"), &bin).expect("copy leasehold");
        chmod(&bin, 0o755);
        let group = format!("{tag}g");
        account(&["groupadd", &group]);
        let gid = nix::unistd::Group::from_name(&group)
            .unwrap()
            .expect("group just added")
            .gid
            .as_raw();
        let mut world = World {
            base,
            bin,
            group: group.clone(),
            gid,
            a: User {
                name: String::new(),
                uid: 0,
                gid,
            },
            b: User {
                name: String::new(),
                uid: 0,
                gid,
            },
            c: User {
                name: String::new(),
                uid: 0,
                gid,
            },
            users: Vec::new(),
            _tmp: tmp,
        };
        // Register each user as soon as it exists, so that a failure later still removes it.
        for s in ["a", "b", "c"] {
            let name = format!("{tag}{s}");
            account(&[
                "useradd",
                "-M",
                "-N",
                "-g",
                &group,
                "-s",
                "/bin/sh",
                "-d",
                "/nonexistent",
                &name,
            ]);
            let uid = nix::unistd::User::from_name(&name)
                .unwrap()
                .expect("user just added")
                .uid
                .as_raw();
            world.users.push(User {
                name: name.clone(),
                uid,
                gid,
            });
        }
        world.a = world.users[0].clone();
        world.b = world.users[1].clone();
        world.c = world.users[2].clone();
        world
    }

    /// A fresh directory under the world: `mode`, owned by `owner` and the world's group.
    pub fn dir(&self, name: &str, mode: u32, owner: Who) -> PathBuf {
        let d = self.base.join(name);
        fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(owner.uid()), Some(self.gid)).unwrap();
        chmod(&d, mode);
        d
    }

    /// `program args` run as `who` with `umask`, stdin null, stdout and stderr captured.
    pub fn cmd(&self, who: Who, umask: u32, program: &Path, args: &[&str]) -> Command {
        let mut c = match who {
            Who::Root => Command::new("sh"),
            Who::User(u) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", u.uid))
                    .arg(format!("--regid={}", u.gid))
                    .arg("--init-groups")
                    .arg("--")
                    .arg("sh");
                c
            }
        };
        c.arg("-c")
            .arg("umask \"$0\" && exec \"$@\"")
            .arg(format!("{umask:03o}"))
            .arg(program)
            .args(args)
            .env("LC_ALL", "C")
            .env_remove("LEASEHOLD_LOCK")
            .stdin(Stdio::null());
        c
    }

    /// `leasehold ARGS` as `who` with `umask`.
    pub fn leasehold(&self, who: Who, umask: u32, args: &[&str]) -> Command {
        self.cmd(who, umask, &self.bin, args)
    }

    /// Starts `leasehold ARGS` as `who`; stderr is collected line by line.
    pub fn spawn(&self, who: Who, umask: u32, args: &[&str]) -> Proc {
        Proc::spawn_collecting(
            self.leasehold(who, umask, args),
            &format!("{} leasehold {args:?}", who.name()),
        )
    }

    /// Runs `leasehold ARGS` as `who` to completion within `limit` (a hang fails the test).
    pub fn run(&self, who: Who, umask: u32, args: &[&str], limit: Duration) -> Outcome {
        let mut p = self.spawn(who, umask, args);
        p.finish(limit)
    }

    /// Runs a shell snippet as `who` (for planting files), asserting it succeeds.
    pub fn sh(&self, who: Who, umask: u32, script: &str, args: &[&str]) {
        let mut c = self.cmd(who, umask, Path::new("sh"), &["-c", script, "sh"]);
        c.args(args);
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "as {}: sh -c {script:?} {args:?}: {}\n{}",
            who.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn kill_users_processes(&self) {
        let uids: Vec<u32> = self.users.iter().map(|u| u.uid).collect();
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let live: Vec<i32> = processes_of(&uids)
                .into_iter()
                .filter(|&p| !is_dead(p))
                .collect();
            if live.is_empty() || Instant::now() > end {
                return;
            }
            for p in live {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.kill_users_processes();
        for u in &self.users {
            // -f: zombies of these users (PID 1 here does not reap orphans) do not block it.
            let _ = Command::new("userdel")
                .args(["-f", &u.name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("groupdel")
            .arg(&self.group)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Removes accounts a killed earlier run of this suite left behind (its Drop guards never ran):
/// names `lh<PID>x<N>` + `a|b|c|g` whose PID no longer runs. Their processes are SIGKILLed by pid
/// first. Accounts of a suite that is still running are left alone.
fn sweep_stale_accounts() {
    let stale = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix("lh") else {
            return false;
        };
        let Some((pid, tail)) = rest.split_once('x') else {
            return false;
        };
        let (n, kind) = tail.split_at(tail.len().saturating_sub(1));
        pid.parse::<i32>().is_ok()
            && !pid.is_empty()
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && matches!(kind, "a" | "b" | "c" | "g")
            && is_dead(pid.parse().unwrap())
    };
    let names = |file: &str| -> Vec<(String, u32)> {
        fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut it = l.split(':');
                let name = it.next()?.to_string();
                let id = it.nth(1)?.parse().ok()?;
                Some((name, id))
            })
            .filter(|(n, _)| stale(n))
            .collect()
    };
    let users = names("/etc/passwd");
    let uids: Vec<u32> = users.iter().map(|u| u.1).collect();
    for p in processes_of(&uids) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for (u, _) in users {
        eprintln!("removing user {u} left by a killed earlier run");
        let _ = Command::new("userdel").args(["-f", &u]).status();
    }
    for (g, _) in names("/etc/group") {
        let _ = Command::new("groupdel").arg(&g).status();
    }
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", p.display()));
}

/// Pids whose real uid is one of `uids`.
pub fn processes_of(uids: &[u32]) -> Vec<i32> {
    let mut v = Vec::new();
    for pid in support::pids() {
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let ruid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|s| s.parse::<u32>().ok());
        if ruid.is_some_and(|u| uids.contains(&u)) {
            v.push(pid);
        }
    }
    v
}

/// Sets `fs.protected_hardlinks` and `fs.protected_symlinks` to 0 while it lives (the attack
/// tests plant links the kernel would otherwise refuse or not follow); restores the old values.
/// Holding it also serialises the tests that need it.
pub struct LinkProtectionsOff {
    old: Vec<(&'static str, String)>,
    _g: MutexGuard<'static, ()>,
}

static SYSCTLS: Mutex<()> = Mutex::new(());

impl LinkProtectionsOff {
    pub fn new() -> LinkProtectionsOff {
        let g = lock(&SYSCTLS);
        let mut old = Vec::new();
        for k in [
            "/proc/sys/fs/protected_hardlinks",
            "/proc/sys/fs/protected_symlinks",
        ] {
            let v = fs::read_to_string(k).unwrap_or_else(|e| panic!("read {k}: {e}"));
            fs::write(k, "0").unwrap_or_else(|e| panic!("write {k}: {e}"));
            old.push((k, v.trim().to_string()));
        }
        LinkProtectionsOff { old, _g: g }
    }
}

impl Drop for LinkProtectionsOff {
    fn drop(&mut self) {
        for (k, v) in &self.old {
            let _ = fs::write(k, v);
        }
    }
}

/// What a path is, as far as an attack could change it: for a regular file its bytes, for a
/// directory its entries (recursively), for a symlink its target; plus type, mode, owner,
/// group, mtime, link count and inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub entries: BTreeMap<PathBuf, String>,
}

impl Snapshot {
    pub fn of(p: &Path) -> Snapshot {
        let mut entries = BTreeMap::new();
        snap(p, p, &mut entries);
        Snapshot { entries }
    }
}

fn snap(root: &Path, p: &Path, out: &mut BTreeMap<PathBuf, String>) {
    let rel = p.strip_prefix(root).unwrap_or(p).to_path_buf();
    let m = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) => {
            out.insert(rel, format!("missing ({e})"));
            return;
        }
    };
    let ft = m.file_type();
    let mut desc = format!(
        "mode {:o} uid {} gid {} nlink {} ino {} mtime {}.{:09}",
        m.mode(),
        m.uid(),
        m.gid(),
        m.nlink(),
        m.ino(),
        m.mtime(),
        m.mtime_nsec()
    );
    if ft.is_file() {
        let bytes = fs::read(p).unwrap_or_default();
        desc.push_str(&format!(
            " size {} fnv {:016x}",
            bytes.len(),
            bytes
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b))
                    .wrapping_mul(0x100_0000_01b3))
        ));
    } else if ft.is_symlink() {
        desc.push_str(&format!(" -> {:?}", fs::read_link(p).ok()));
    } else if ft.is_dir() {
        let mut names: Vec<PathBuf> = fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        for n in names {
            snap(root, &n, out);
        }
    }
    out.insert(rel, desc);
}

/// Processes that must never be signalled: one per user (root and the world's users), each in
/// its own process group, trapping the catchable signals into a log; SIGKILL/SIGSTOP show as a
/// dead or stopped process.
pub struct Bystanders {
    procs: Vec<(String, Child, PathBuf)>,
}

impl Bystanders {
    pub fn start(w: &World) -> Bystanders {
        let dir = w.dir("bystanders", 0o777, Who::Root);
        let dir = dir.as_path();
        let mut procs = Vec::new();
        for who in [Who::Root, Who::User(&w.a), Who::User(&w.b)] {
            let log = dir.join(format!("bystander-{}", who.name()));
            fs::write(&log, "").unwrap();
            std::os::unix::fs::chown(&log, Some(who.uid()), None).unwrap();
            let ready = dir.join(format!("bystander-{}.ready", who.name()));
            let script = r#"log=$1
for s in HUP INT QUIT USR1 USR2 ALRM TERM CONT PIPE; do trap "echo $s >> '$log'" $s; done
touch "$2"
while :; do sleep 5 & wait $! 2>/dev/null; done"#;
            let mut c = w.cmd(
                who,
                0o022,
                Path::new("sh"),
                &[
                    "-c",
                    script,
                    "sh",
                    log.to_str().unwrap(),
                    ready.to_str().unwrap(),
                ],
            );
            c.stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0);
            let child = c.spawn().unwrap();
            assert!(
                wait_until(Duration::from_secs(10), || ready.exists()),
                "bystander of {} did not start",
                who.name()
            );
            procs.push((who.name(), child, log));
        }
        Bystanders { procs }
    }

    /// Panics unless every bystander is alive, running, and logged no signal.
    #[track_caller]
    pub fn assert_untouched(&mut self) {
        for (who, child, log) in &mut self.procs {
            let pid = child.id() as i32;
            let st = child.try_wait().unwrap();
            assert!(st.is_none(), "bystander of {who} (pid {pid}) died: {st:?}");
            let state = support::stat_fields(pid)
                .map(|f| f[0].clone())
                .unwrap_or_default();
            assert!(
                state != "T" && state != "t",
                "bystander of {who} (pid {pid}) was stopped"
            );
            let got = fs::read_to_string(&*log).unwrap_or_default();
            assert!(
                got.trim().is_empty(),
                "bystander of {who} (pid {pid}) received signals: {got}"
            );
        }
    }
}

impl Drop for Bystanders {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.procs {
            // Its process group: the shell and its sleep.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
    }
}

/// How long a multi-user command may take before the test calls it a hang.
pub const LONG: Duration = Duration::from_secs(40);

/// Failures collected over a test's cases, reported together at its end.
#[derive(Default)]
pub struct Failures(RefCell<Vec<String>>);

impl Failures {
    pub fn check(&self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            let m = msg();
            eprintln!("FAIL: {m}");
            self.0.borrow_mut().push(m);
        }
    }

    /// Panics with every failure collected, if any.
    #[track_caller]
    pub fn done(self, test: &str) {
        let v = self.0.into_inner();
        assert!(
            v.is_empty(),
            "{test}: {} failure(s):\n- {}",
            v.len(),
            v.join("\n- ")
        );
    }
}

/// The exit status and the last line leasehold printed, for the test's log.
pub fn first_line(o: &Outcome) -> String {
    format!(
        "exit {} ({:?})",
        o.code,
        o.stderr
            .lines()
            .last()
            .unwrap_or("")
            .chars()
            .take(300)
            .collect::<String>()
    )
}

/// How a command ended, for a failure message: exit status, time, and (the start of) stderr.
pub fn describe(o: &Outcome) -> String {
    let mut e = o.stderr.clone();
    if e.len() > 800 {
        let mut cut = 800;
        while !e.is_char_boundary(cut) {
            cut -= 1;
        }
        e.truncate(cut);
        e.push_str("...");
    }
    format!("exit {} after {:?}; stderr: {e:?}", o.code, o.took)
}

/// Waits up to `limit` for `p`'s wait line (one that says it is waiting).
pub fn wait_line(p: &Proc, limit: Duration) -> Option<(String, Duration)> {
    p.wait_line(limit, |l| l.contains("aiting"))
}

fn strs<S: AsRef<str>>(v: &[S]) -> Vec<&str> {
    v.iter().map(AsRef::as_ref).collect()
}

/// One multi-user test: its name, its [`World`], the [`Bystanders`], the [`Failures`] collected
/// and a critical-section checker `cs` (directory `cs` under the world). [`Scene::finish`] makes
/// the checks every such test ends with.
pub struct Scene {
    pub test: &'static str,
    pub w: World,
    pub by: Bystanders,
    pub f: Failures,
    pub cs: Cs,
}

impl Scene {
    /// The scene of `test`, or None when it cannot run here (see [`skip`]: said why, or failed
    /// under CI).
    pub fn new(test: &'static str) -> Option<Scene> {
        if skip(test) {
            return None;
        }
        Some(Scene::start(test))
    }

    /// The scene of `test`, for a caller that has made the [`skip`] check itself.
    pub fn start(test: &'static str) -> Scene {
        let w = World::new();
        let by = Bystanders::start(&w);
        let cs = Cs::new(&w.base, "cs");
        Scene {
            test,
            w,
            by,
            f: Failures::default(),
            cs,
        }
    }

    pub fn a(&self) -> Who<'_> {
        Who::User(&self.w.a)
    }
    pub fn b(&self) -> Who<'_> {
        Who::User(&self.w.b)
    }
    pub fn c(&self) -> Who<'_> {
        Who::User(&self.w.c)
    }

    /// `job.lock` in a fresh directory `name` of `mode`, owned by root and the world's group.
    pub fn lock_in(&self, name: &str, mode: u32) -> PathBuf {
        self.w.dir(name, mode, Who::Root).join("job.lock")
    }

    /// Runs `leasehold ARGS` as `who` with `umask` to completion within [`LONG`].
    pub fn run_as<S: AsRef<str>>(&self, who: Who, umask: u32, args: &[S]) -> Outcome {
        self.run_within(who, umask, args, LONG)
    }

    /// Runs `leasehold ARGS` as `who` with `umask` to completion within `limit`.
    pub fn run_within<S: AsRef<str>>(
        &self,
        who: Who,
        umask: u32,
        args: &[S],
        limit: Duration,
    ) -> Outcome {
        self.w.run(who, umask, &strs(args), limit)
    }

    /// Starts `leasehold ARGS` as `who` with `umask`.
    pub fn spawn_as<S: AsRef<str>>(&self, who: Who, umask: u32, args: &[S]) -> Proc {
        self.w.spawn(who, umask, &strs(args))
    }

    /// Starts `leasehold run PRE LOCK -- job` (job `id` of `cs`, held until released) as `who`
    /// and waits up to `limit` for the job to enter: the holder, or how it ended without
    /// entering.
    #[allow(clippy::too_many_arguments)]
    pub fn hold(
        &self,
        cs: &Cs,
        who: Who,
        umask: u32,
        pre: &[&str],
        lock: &Path,
        id: &str,
        limit: Duration,
    ) -> Result<Proc, Outcome> {
        let mut holder = self.spawn_as(who, umask, &cs.hold_args(pre, lock, id));
        if wait_until(limit, || {
            cs.entered(id) || holder.child.try_wait().unwrap().is_some()
        }) && cs.entered(id)
        {
            Ok(holder)
        } else {
            Err(holder.finish(LONG))
        }
    }

    /// Starts `flock PATH sh -c SCRIPT READY ARGS...` as `who` (umask 002) and asserts that
    /// SCRIPT, holding the flock of `path`, creates READY (`$0`) within 10 s. `what` names it.
    pub fn flock_as(&self, who: Who, path: &Path, script: &str, args: &[&str], what: &str) -> Proc {
        let ready = self.cs.dir.join(format!(
            "flock-ready-{}",
            path.file_name().unwrap().to_string_lossy()
        ));
        let mut a = vec![
            path.to_str().unwrap(),
            "sh",
            "-c",
            script,
            ready.to_str().unwrap(),
        ];
        a.extend(args);
        let p = Proc::spawn(self.w.cmd(who, 0o002, Path::new("flock"), &a), what);
        assert!(
            wait_until(Duration::from_secs(10), || ready.exists()),
            "{what} did not take the flock of {}: {}",
            path.display(),
            p.stderr_so_far()
        );
        p
    }

    /// Records a failure unless `ok`: `what`, then how `o` ended.
    pub fn expect(&self, ok: bool, o: &Outcome, what: impl Display) {
        self.f.check(ok, || format!("{what}: {}", describe(o)));
    }

    /// Records a failure unless `o` exited 0.
    pub fn expect_ok(&self, o: &Outcome, what: impl Display) {
        self.expect(o.code == 0, o, what);
    }

    /// Records a failure unless `ok`.
    pub fn check(&self, ok: bool, msg: impl FnOnce() -> String) {
        self.f.check(ok, msg);
    }

    /// The checks every multi-user test ends with: no two jobs of `cs` overlapped, no bystander
    /// was signalled, stopped or killed, and no failure was recorded.
    #[track_caller]
    pub fn finish(mut self) {
        self.cs.verify();
        self.by.assert_untouched();
        self.f.done(self.test);
    }
}
