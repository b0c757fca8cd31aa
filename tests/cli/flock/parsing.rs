//! The command line and exit statuses of the `flock` name, input by input against util-linux's
//! flock, and the `leasehold flock` spelling.

use super::*;

#[test]
fn usage_help_and_version_exit_as_util_linux_flock_does() {
    let Some(b) = Bench::new() else { return };
    let cases: &[&[&str]] = &[
        &[],
        &["-n"],
        &["--bogus", "f", "true"],
        &["--n", "f", "true"],
        &["--shared=1", "f", "true"],
        &["--wait"],
        &["-w"],
        &["-z", "f", "true"],
        &["-?"],
        &["-E", "300", "f", "true"],
        &["-E", "0x10", "f", "true"],
        &["-w", "abc", "f", "true"],
        &["f", "-c"],
        &["f", "-c", "a", "b"],
        &["-oF", "f", "true"],
        &["--no-fork", "--close", "f", "true"],
        &["abc"],
        &["-c", "true", "f"],
        &["-h"],
        &["--he"],
        &["-V"],
        &["-h", "--bogus"],
    ];
    let cwd = b.path("cwd");
    fs::create_dir(&cwd).unwrap();
    for args in cases {
        let (ours, _, ours_err) = outcome({
            let mut c = b.ours(args);
            c.current_dir(&cwd);
            c
        });
        let (theirs, _, _) = outcome({
            let mut c = real(args);
            c.current_dir(&cwd);
            c
        });
        assert_eq!(
            ours, theirs,
            "flock {args:?}: ours {ours}, util-linux {theirs}"
        );
        if ours == 64 {
            assert!(
                ours_err.starts_with("flock: ") || ours_err.starts_with("Try 'flock --help'"),
                "flock {args:?}: {ours_err}"
            );
        }
    }
    assert!(
        fs::read_dir(&cwd).unwrap().next().is_none(),
        "a usage error created a file"
    );
    let (_, help, _) = outcome(b.ours(&["--help"]));
    assert!(
        help.starts_with(
            "\nUsage:\n flock [options] <file>|<directory> <command> [<argument>...]\n"
        ),
        "{help}"
    );
    for opt in [
        "--nonblock",
        "--timeout",
        "--conflict-exit-code",
        "--no-fork",
        "--fcntl",
    ] {
        assert!(help.contains(opt), "help lacks {opt}");
    }
}

#[test]
fn exit_statuses_match_util_linux_flock_and_success_is_silent() {
    let Some(b) = Bench::new() else { return };
    let f = users_file(&b, "f");
    let d = b.path("d");
    fs::create_dir(&d).unwrap();
    let (fs_, ds) = (f.to_str().unwrap(), d.to_str().unwrap());
    let missing = b.path("no-such-dir/f");
    let cases: Vec<Vec<&str>> = vec![
        vec![fs_, "true"],
        vec![fs_, "sh", "-c", "exit 3"],
        vec![fs_, "sh", "-c", "kill -9 $$"],
        vec![fs_, "-c", "exit 5"],
        vec!["-x", fs_, "--command", "exit 6"],
        vec![fs_, "no-such-command-x"],
        vec![missing.to_str().unwrap(), "true"],
        vec!["-n", "99"],
        vec!["-w", "-1", fs_, "true"],
        vec!["-s", fs_, "true"],
        vec!["-u", fs_, "true"],
        vec!["-nx", "-w", "3", fs_, "true"],
        vec!["--nb", "--timeout=2", fs_, "true"],
        vec![ds, "true"],
        vec!["-s", ds, "sh", "-c", "exit 9"],
        vec!["-F", fs_, "sh", "-c", "exit 4"],
        vec!["-F", fs_, "no-such-command-x"],
        vec!["-o", fs_, "sh", "-c", "exit 2"],
        vec![fs_, "--", "true"],
    ];
    let before = fingerprint(&f);
    for args in &cases {
        let (ours, _, ours_err) = outcome(b.ours(args));
        let (theirs, _, _) = outcome(real(args));
        assert_eq!(
            ours, theirs,
            "flock {args:?}: ours {ours}, util-linux {theirs}"
        );
        if ours == 0 || (ours < 64 && ours != 1) || ours == 137 {
            assert_eq!(ours_err, "", "flock {args:?} printed on stderr");
        } else {
            assert!(
                ours_err.starts_with("flock: "),
                "flock {args:?}: {ours_err:?}"
            );
        }
    }
    assert_eq!(fingerprint(&f), before, "the user's file changed");
    // --fcntl (util-linux 2.41; older ones lack it): an exclusive OFD lock opens for writing,
    // still without truncating.
    assert_eq!(outcome(b.ours(&["--fcntl", fs_, "true"])).0, 0);
    assert_eq!(outcome(b.ours(&["--fcntl", "-s", fs_, "true"])).0, 0);
    assert_eq!(
        fingerprint(&f),
        before,
        "the user's file changed under --fcntl"
    );
    // --verbose: flock's own two lines on stdout, in its shape, for ours as for util-linux's.
    for flock in [b.ours_path(), PathBuf::from(REAL)] {
        let mut c = Command::new(&flock);
        c.args(["--verbose", fs_, "true"]).stdin(Stdio::null());
        let (c, out, err) = outcome(c);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            (c, err.as_str(), lines.len()),
            (0, "", 2),
            "{flock:?}: {out}"
        );
        let took = lines[0]
            .strip_prefix("flock: getting lock took ")
            .and_then(|t| t.strip_suffix(" seconds"))
            .unwrap_or_else(|| panic!("{flock:?}: {out}"));
        let (secs, micros) = took.split_once('.').unwrap();
        assert!(secs.parse::<u64>().is_ok() && micros.len() == 6, "{out}");
        assert_eq!(lines[1], "flock: executing true");
    }
    // The lease lives in the runtime directory (exclusive, forked), under its documented name.
    let lease = lease_of(&b.path("f"));
    assert!(
        lease.starts_with("/run/lock/leasehold/") || !is_root(),
        "{}",
        lease.display()
    );
    assert_eq!(lease_state(&lease).as_deref(), Some("released"));
}

#[test]
fn leasehold_flock_subcommand_is_the_same_front_end() {
    let Some(b) = Bench::new() else { return };
    let f = b.path("f");
    let (c, out, _) = outcome({
        let mut c = lh();
        c.args(["flock", "-n"]).arg(&f).args(["echo", "ran"]);
        c
    });
    assert_eq!((c, out.as_str()), (0, "ran\n"));
    let (c, _, err) = outcome({
        let mut c = lh();
        c.args(["flock", "--bogus"]);
        c
    });
    assert_eq!(c, 64);
    assert!(
        err.starts_with("leasehold flock: unrecognized option '--bogus'"),
        "{err}"
    );
}
