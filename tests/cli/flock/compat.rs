//! The comparison harness: real scripts' flock(1) idioms, each run once with util-linux's
//! `/usr/bin/flock` and once with the drop-in, in fresh directories, and compared on what a
//! script notices — exit status, stdout and stderr (normalised: digit runs, the directory and the
//! flock's path), which of the processes the script recorded in `pids` are alive afterwards
//! (background children, daemons), whether the caller's next step ran (it prints), and which
//! files exist in the directory afterwards (helper files; `.git/` itself is not listed).
//!
//! The same harness run with `/usr/bin/flock` on both sides must find no difference
//! (`harness_finds_no_difference_between_util_linux_and_itself`), so a failure can only be a
//! real difference; and it must find one where the drop-in is asked to fence
//! (`harness_sees_the_fencing_drop_in_kill_a_background_child`), so it can fail.
//!
//! `LEASEHOLD_COMPAT_FLOCK=PATH` replaces the drop-in by another binary (e.g. an older build,
//! to see which scenarios it breaks).

use super::*;

/// One scenario: a `sh -c` script run in a fresh directory with `$FLOCK` the flock under test,
/// `$REAL` util-linux's (for probes), `$SRC` the directory holding this crate's test helpers.
struct Scenario {
    name: &'static str,
    script: &'static str,
    needs: &'static [&'static str],
}

/// The scenario util-linux before 2.41 cannot run (no `--fcntl`), and what 2.41's flock(1)
/// prints for it: the `--fcntl` lock is independent of the flock lock, so the inner one runs.
const FCNTL_NESTED: &str = "--fcntl inside a flock on the same file is independent";
const FCNTL_NESTED_OUT: &str = "inner\ninner 0\nouter 0\n";

/// Whether util-linux's flock knows `--fcntl` (2.41 and later).
fn real_has_fcntl() -> bool {
    Command::new(REAL)
        .args(["--fcntl", "-n", "/dev/null", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What a script run left for the comparison.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    code: i32,
    out: String,
    err: String,
    alive: Vec<bool>,
    files: Vec<String>,
}

/// Digit runs of four or more (pids, inode numbers) and `--verbose`'s time → `N`, the work
/// directory → `DIR`, the flock's own path → `FLOCK`. Shorter numbers (exit statuses, counts)
/// are compared as they are.
fn normalise(s: &str, dir: &Path, flock: &Path) -> String {
    let s = s
        .replace(&*dir.to_string_lossy(), "DIR")
        .replace(&*flock.to_string_lossy(), "FLOCK");
    let s: String = s
        .lines()
        .map(|l| match (l.find(" took "), l.find(" seconds")) {
            (Some(a), Some(b)) if a < b => format!("{} took N seconds\n", &l[..a]),
            _ => format!("{l}\n"),
        })
        .collect();
    let mut out = String::with_capacity(s.len());
    let mut digits = String::new();
    for c in s.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if digits.len() >= 4 {
            out.push('N');
        } else {
            out.push_str(&digits);
        }
        digits.clear();
        if c != '\0' {
            out.push(c);
        }
    }
    out
}

/// Every name under `dir` (relative, sorted), without `.git/`'s contents and the harness's
/// `pids` file.
fn files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "pids" || rel == ".git" {
                continue;
            }
            out.push(rel);
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &p, out);
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// A directory (outside the work directory) holding `flock`: a symlink to `target`, so that
/// both flocks are called by the same name (and say `flock:` in their messages).
fn named_flock(target: &Path) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("flock");
    std::os::unix::fs::symlink(target, &p).unwrap();
    (d, p)
}

/// Runs `sc` with `flock` (and `env`) and returns what it left; kills what it left running.
fn observe(flock: &Path, sc: &Scenario, env: &[(&str, &str)]) -> Seen {
    let (_bin, named) = named_flock(flock);
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(sc.script)
        .current_dir(dir)
        .env("FLOCK", &named)
        .env("REAL", REAL)
        .env_remove("LEASEHOLD_FLOCK_FENCE")
        .envs(env.iter().copied())
        .process_group(0)
        .stdin(Stdio::null());
    let o = Proc::spawn_collecting(c, &format!("{} with {}", sc.name, flock.display()))
        .finish(Duration::from_secs(60));
    let pids: Vec<i32> = fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let alive = pids.iter().map(|&p| !is_dead(p)).collect();
    for &p in &pids {
        if !is_dead(p) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    Seen {
        code: o.code,
        out: normalise(&o.stdout, dir, &named),
        err: normalise(&o.stderr, dir, &named),
        alive,
        files: files(dir),
    }
}

/// The scenarios each issue-28 "break" was reported with, then idioms that already matched.
const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "-o with a background child: the child keeps running, without the lock",
        script: r#""$FLOCK" -o L sh -c 'sleep 60 & echo $! >> pids'; echo "next $?"
            "$REAL" -n L true; echo "probe $?""#,
        needs: &[],
    },
    Scenario {
        name: "-n -c with a background worker: it keeps running and keeps the lock",
        script: r#""$FLOCK" -n L -c 'sleep 60 & echo $! >> pids'; echo "next $?"
            "$REAL" -n L true; echo "probe $?""#,
        needs: &[],
    },
    Scenario {
        name: "-F with a background child: it keeps running and keeps the lock",
        script: r#""$FLOCK" -F L sh -c 'sleep 60 & echo $! >> pids'; echo "next $?"
            "$REAL" -n L true; echo "probe $?""#,
        needs: &[],
    },
    Scenario {
        name: "-o with a daemon that forks and calls setsid, 20 times: every daemon lives",
        script: r#"for i in $(seq 20); do
              "$FLOCK" -o L sh -c 'sh -c "echo \$\$ >> pids; exec setsid sleep 60" &'
              echo "next $?"
            done
            n=0; while [ "$(wc -l < pids)" -lt 20 ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
            wc -l < pids"#,
        needs: &["setsid"],
    },
    Scenario {
        name: "a CI cancel (SIGKILL of the job's process group) leaves nothing of the job alive",
        script: r#"setsid sh -c '"$FLOCK" L sh -c "sleep 60 & echo \$! >> pids; exec sleep 60"' 2>err &
            pg=$!; exec 2>/dev/null
            n=0; while [ ! -s pids ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
            kill -KILL -$pg; wait $pg; echo "job $?"
            sleep 0.3
            "$REAL" -n L true; echo "probe $?"; cat err"#,
        needs: &["setsid"],
    },
    Scenario {
        name: "Ctrl-Z past the TTL, then fg: the job finishes",
        script: r#"export LEASEHOLD_FLOCK_TTL=1s
            "$FLOCK" L sh -c ': > started; sleep 2.5; echo finished' & f=$!
            n=0; while [ ! -e started ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
            kill -STOP $f; sleep 2; kill -CONT $f
            wait $f; echo "rc $?""#,
        needs: &[],
    },
    Scenario {
        name: "a lock in a git work tree leaves it clean",
        script: r#"git init -q . && printf '*.lock\n' > .gitignore && git add .gitignore
            git -c user.name=t -c user.email=t@t commit -qm init
            "$FLOCK" job.lock true; echo "next $?"
            "$FLOCK" -n job.lock -c 'git clean -fdxq -e job.lock; echo cleaned'; echo "next $?"
            git status --porcelain; echo "status done""#,
        needs: &["git"],
    },
    Scenario {
        name: "flock DIR creates nothing beside DIR",
        script: r#"mkdir d; "$FLOCK" d -c true; echo "next $?"; "$FLOCK" -n d -c true; echo "again $?""#,
        needs: &[],
    },
    Scenario {
        name: "flock /etc/passwd-like file in a directory creates nothing beside it",
        script: r#"echo data > passwd; chmod 444 passwd; "$FLOCK" passwd true; echo "next $?""#,
        needs: &[],
    },
    Scenario {
        name: "-u of a shared lock returns at once while a sibling holds one",
        script: r#"exec 8>L; "$FLOCK" -s 8; echo "shared $?"
            ( exec 7>L; "$FLOCK" -s 7; : > sibling; exec sleep 60 ) & echo $! >> pids
            n=0; while [ ! -e sibling ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
            s=$(date +%s%N); "$FLOCK" -u 8; r=$?; e=$(date +%s%N)
            [ $(( (e - s) / 1000000 )) -lt 2000 ] && echo "unlock $r at once" || echo "unlock $r slow""#,
        needs: &["date"],
    },
    Scenario {
        name: FCNTL_NESTED,
        script: r#""$FLOCK" F sh -c '"$FLOCK" -n --fcntl F echo inner; echo "inner $?"'; echo "outer $?""#,
        needs: &[],
    },
    Scenario {
        name: "--verbose prints flock(1)'s lines only",
        script: r#""$FLOCK" --verbose L true; echo "next $?""#,
        needs: &[],
    },
    // Idioms that already matched: regression guards.
    Scenario {
        name: "-n -c runs and passes the status on",
        script: r#""$FLOCK" -n L -c 'echo in; exit 3'; echo "rc $?""#,
        needs: &[],
    },
    Scenario {
        name: "-n is refused while another holds the lock, with -E's status",
        script: r#""$FLOCK" L sh -c '"$FLOCK" -n L true; echo "inner $?"; "$FLOCK" -n -E 9 L true; echo "inner $?"'"#,
        needs: &[],
    },
    Scenario {
        name: "-w times out while another holds the lock",
        script: r#""$FLOCK" L sh -c '"$FLOCK" -w 0.2 L true; echo "inner $?"'; echo "outer $?""#,
        needs: &[],
    },
    Scenario {
        name: "a command killed by a signal gives 128+N",
        script: r#""$FLOCK" L sh -c 'kill -TERM $$'; echo "rc $?""#,
        needs: &[],
    },
    Scenario {
        name: "a missing command gives flock's message and status",
        script: r#""$FLOCK" L ./no-such-command; echo "rc $?""#,
        needs: &[],
    },
    Scenario {
        name: "the FD form: lock, refuse another, unlock",
        script: r#"exec 9>L; "$FLOCK" -n 9; echo "got $?"
            sh -c '"$FLOCK" -n L true; echo "other $?"' 9>&-
            "$FLOCK" -u 9; echo "unlocked $?"
            sh -c '"$FLOCK" -n L true; echo "other $?"' 9>&-"#,
        needs: &[],
    },
    Scenario {
        name: "the FD form's lock goes with the shell's descriptor",
        script: r#"sh -c 'exec 9>L; "$FLOCK" 9; echo held'; "$REAL" -n L true; echo "probe $?""#,
        needs: &[],
    },
    Scenario {
        name: "shared holders together, an exclusive one refused",
        script: r#""$FLOCK" -s L sh -c '"$FLOCK" -s -n L echo both; "$FLOCK" -x -n L true; echo "x $?"'"#,
        needs: &[],
    },
    Scenario {
        name: "-F execs the command in flock's place",
        script: r#""$FLOCK" -F L sh -c 'echo f; exit 4'; echo "rc $?""#,
        needs: &[],
    },
    Scenario {
        name: "-o: the command does not hold the lock's descriptor",
        script: r#""$FLOCK" -o L sh -c '"$REAL" -n L true; echo "probe $?"'"#,
        needs: &[],
    },
    Scenario {
        name: "the FLOCKER idiom: a script that locks itself",
        script: r#"printf '%s\n' '#!/bin/sh' '[ "${FLOCKER}" != "$0" ] && exec env FLOCKER="$0" "$FLOCK" -en "$0" "$0" "$@" || :' 'echo body' > s.sh
            chmod +x s.sh; ./s.sh; echo "rc $?""#,
        needs: &[],
    },
    Scenario {
        name: "the command runs in the caller's process group",
        script: r#""$FLOCK" L sh -c 'ps -o pgid= -p $$ > inner'; ps -o pgid= -p $$ > outer
            cmp -s inner outer; echo "same group $?""#,
        needs: &["ps"],
    },
    Scenario {
        name: "a usage error",
        script: r#""$FLOCK" L; echo "rc $?""#,
        needs: &[],
    },
];

/// The flock standing in for the drop-in: `LEASEHOLD_COMPAT_FLOCK`, else this crate's binary.
fn drop_in() -> PathBuf {
    std::env::var_os("LEASEHOLD_COMPAT_FLOCK").map_or_else(bin, PathBuf::from)
}

/// Runs every scenario with `a` and with `b`; returns each differing one, described.
fn differences(a: &Path, b: &Path, env_b: &[(&str, &str)]) -> Vec<String> {
    let mut bad = Vec::new();
    for sc in SCENARIOS {
        if sc.needs.iter().any(|t| !have(t)) {
            say_skipped(sc.name, file!(), "a tool it needs is missing");
            continue;
        }
        let y = observe(b, sc, env_b);
        if sc.name == FCNTL_NESTED && (a != b) && !real_has_fcntl() {
            say_skipped(
                sc.name,
                file!(),
                "util-linux before 2.41: compared with 2.41's output",
            );
            if (y.code, y.out.as_str(), y.err.as_str()) != (0, FCNTL_NESTED_OUT, "") {
                bad.push(format!("{}: {}: {y:?}", sc.name, b.display()));
            }
            continue;
        }
        let x = observe(a, sc, &[]);
        if x != y {
            bad.push(format!(
                "{}:\n  {}: {x:?}\n  {}: {y:?}",
                sc.name,
                a.display(),
                b.display()
            ));
        }
    }
    bad
}

#[test]
fn drop_in_behaves_as_util_linux_flock_in_every_scenario() {
    if Bench::new().is_none() {
        return;
    }
    let bad = differences(Path::new(REAL), &drop_in(), &[]);
    assert!(
        bad.is_empty(),
        "{} differences:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn harness_finds_no_difference_between_util_linux_and_itself() {
    if Bench::new().is_none() {
        return;
    }
    let bad = differences(Path::new(REAL), Path::new(REAL), &[]);
    assert!(
        bad.is_empty(),
        "{} differences:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn harness_sees_the_fencing_drop_in_kill_a_background_child() {
    if Bench::new().is_none() {
        return;
    }
    // Asked for fencing, the drop-in stops what the command leaves in its group: a difference
    // the harness must see (else it could not fail).
    let sc = &SCENARIOS[1];
    let x = observe(Path::new(REAL), sc, &[]);
    let y = observe(&bin(), sc, &[("LEASEHOLD_FLOCK_FENCE", "1")]);
    assert_eq!(x.alive, vec![true], "{x:?}");
    assert_eq!(y.alive, vec![false], "{y:?}");
}

#[test]
fn status_of_a_missing_file_or_dev_null_or_an_ordinary_file_creates_nothing() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("plain"), "").unwrap();
    for f in ["missing", "plain"] {
        let o = lh().arg("status").arg(d.path().join(f)).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{o:?}");
    }
    assert_eq!(files(d.path()), vec!["plain".to_string()]);
    let ours = || -> Vec<std::ffi::OsString> {
        fs::read_dir("/dev")
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().contains("leasehold"))
            .collect()
    };
    let before = ours();
    // Refused as not a lease ("left untouched"): whatever it says, it creates nothing.
    let _ = lh().args(["status", "/dev/null"]).output().unwrap();
    assert_eq!(ours(), before, "status /dev/null created a file in /dev");
}

/// Asked for its lease too, `flock -u` of a shared lock does not wait for the lease's keeper,
/// which a sibling's shared lock in the same job keeps (it waited 10 s before).
#[test]
fn asked_for_its_lease_flock_u_of_a_shared_lock_still_returns_at_once() {
    if Bench::new().is_none() {
        return;
    }
    let sc = SCENARIOS
        .iter()
        .find(|s| s.name.starts_with("-u of a shared lock"))
        .unwrap();
    let y = observe(&bin(), sc, &[("LEASEHOLD_FLOCK_FENCE", "1")]);
    assert_eq!(y.out, "shared 0\nunlock 0 at once\n", "{y:?}");
    assert_eq!(y.alive, vec![true], "{y:?}");
}
