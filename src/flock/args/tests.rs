//! Unit tests of the flock(1) command-line parser: every option, bundling, prefixes, `--`,
//! the forms, and the refusals flock(1) makes (checked against util-linux's behaviour).

use super::*;

fn p(args: &[&str]) -> Parsed {
    let v: Vec<OsString> = args.iter().map(OsString::from).collect();
    parse(&v)
}

fn run(args: &[&str]) -> (Options, Target) {
    match p(args) {
        Parsed::Run(o, t) => (o, t),
        other => panic!("{args:?}: expected a run, got {other:?}"),
    }
}

fn usage_first(args: &[&str]) -> String {
    match p(args) {
        Parsed::Usage(lines) => lines.first().cloned().unwrap_or_default(),
        other => panic!("{args:?}: expected a usage error, got {other:?}"),
    }
}

fn file(path: &str, cmd: &[&str]) -> Target {
    Target::File {
        path: path.into(),
        command: cmd.iter().map(OsString::from).collect(),
    }
}

#[test]
fn defaults_are_exclusive_blocking_conflict_one() {
    let (o, t) = run(&["f", "true"]);
    assert_eq!(o.mode, Mode::Exclusive);
    assert_eq!(o.wait, Wait::Forever);
    assert_eq!(o.conflict, 1);
    assert!(!o.close && !o.no_fork && !o.verbose);
    assert_eq!(o.api, Api::Flock);
    assert_eq!(t, file("f", &["true"]));
}

#[test]
fn bundled_short_options_and_attached_arguments() {
    let (o, _) = run(&["-nx", "f", "true"]);
    assert_eq!((o.mode, o.wait), (Mode::Exclusive, Wait::No));
    let (o, _) = run(&["-sw5", "f", "true"]);
    assert_eq!(
        (o.mode, o.wait),
        (Mode::Shared, Wait::For(Duration::from_secs(5)))
    );
    let (o, _) = run(&["-w", "1.5", "-E", "123", "f", "true"]);
    assert_eq!(o.wait, Wait::For(Duration::from_millis(1500)));
    assert_eq!(o.conflict, 123);
    let (o, _) = run(&["-oE7", "f", "true"]);
    assert!(o.close);
    assert_eq!(o.conflict, 7);
    let (o, _) = run(&["-xsu", "f", "true"]);
    assert_eq!(o.mode, Mode::Unlock, "the last of -s/-x/-u wins");
    let (o, _) = run(&["-e", "-F", "f", "true"]);
    assert!(o.no_fork);
}

#[test]
fn long_options_by_unique_prefix_and_with_equals() {
    for a in ["--nb", "--nonblock", "--nonblocking", "--non"] {
        assert_eq!(run(&[a, "f", "true"]).0.wait, Wait::No, "{a}");
    }
    assert_eq!(
        run(&["--time=3", "f", "true"]).0.wait,
        Wait::For(Duration::from_secs(3))
    );
    assert_eq!(
        run(&["--wait", "3", "f", "true"]).0.wait,
        Wait::For(Duration::from_secs(3))
    );
    assert_eq!(run(&["--conf=9", "f", "true"]).0.conflict, 9);
    assert_eq!(run(&["--fc", "f", "true"]).0.api, Api::Ofd);
    assert!(run(&["--verb", "f", "true"]).0.verbose);
    assert_eq!(run(&["--sh", "f", "true"]).0.mode, Mode::Shared);
    assert!(run(&["--no-", "f", "true"]).0.no_fork);
    assert!(run(&["--clo", "f", "true"]).0.close);
    assert_eq!(p(&["--he"]), Parsed::Help);
    assert_eq!(p(&["--vers"]), Parsed::Version);
}

#[test]
fn ambiguous_unknown_and_misused_long_options_are_usage_errors() {
    assert_eq!(
        usage_first(&["--n", "f", "true"]),
        "option '--n' is ambiguous; possibilities: '--nonblocking' '--no-fork'"
    );
    assert!(usage_first(&["--c", "f", "true"]).contains("ambiguous"));
    assert!(usage_first(&["--ver", "f", "true"]).contains("ambiguous"));
    assert_eq!(
        usage_first(&["--bogus", "f", "true"]),
        "unrecognized option '--bogus'"
    );
    assert_eq!(
        usage_first(&["--shared=1", "f", "true"]),
        "option '--shared' doesn't allow an argument"
    );
    assert_eq!(
        usage_first(&["--wait"]),
        "option '--wait' requires an argument"
    );
    assert_eq!(usage_first(&["-w"]), "option requires an argument -- 'w'");
    assert_eq!(usage_first(&["-z", "f", "true"]), "invalid option -- 'z'");
    assert!(matches!(p(&["-?"]), Parsed::Usage(_)));
    // --command is not an option, only a word after FILE.
    assert!(usage_first(&["--command", "x", "f"]).contains("unrecognized"));
    assert!(usage_first(&["-c", "x", "f"]).contains("invalid option"));
}

#[test]
fn options_stop_at_the_first_non_option_and_at_double_dash() {
    assert_eq!(run(&["f", "-n", "x"]).1, file("f", &["-n", "x"]));
    let (o, t) = run(&["-n", "--", "-f", "true"]);
    assert_eq!(o.wait, Wait::No);
    assert_eq!(t, file("-f", &["true"]));
    assert_eq!(run(&["f", "--", "true"]).1, file("f", &["--", "true"]));
    assert_eq!(run(&["-", "true"]).1, file("-", &["true"]));
}

#[test]
fn the_three_forms() {
    assert_eq!(run(&["f", "echo", "a b"]).1, file("f", &["echo", "a b"]));
    // SAFETY of the test: SHELL is read, the test process sets nothing.
    let shell = std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into());
    let (_, t) = run(&["f", "-c", "echo hi"]);
    assert_eq!(
        t,
        Target::File {
            path: "f".into(),
            command: vec![shell.clone(), "-c".into(), "echo hi".into()],
        }
    );
    let (_, t) = run(&["f", "--command", "x"]);
    assert!(matches!(t, Target::File { command, .. } if command[2] == "x"));
    assert_eq!(run(&["-u", "4"]).1, Target::Fd(4));
    assert_eq!(run(&["9"]).1, Target::Fd(9));
    assert_eq!(run(&[" -1"]).1, Target::Fd(-1));
    assert_eq!(usage_first(&["abc"]), "bad file descriptor: 'abc'");
    assert_eq!(
        usage_first(&["f", "-c"]),
        "-c requires exactly one command argument"
    );
    assert_eq!(
        usage_first(&["f", "-c", "a", "b"]),
        "-c requires exactly one command argument"
    );
    assert_eq!(
        usage_first(&["-n"]),
        "requires file descriptor, file or directory"
    );
    assert_eq!(usage_first(&[]), "not enough arguments");
}

#[test]
fn timeouts_exit_codes_and_incompatible_options() {
    assert_eq!(run(&["-w", "0", "f", "true"]).0.wait, Wait::No);
    assert_eq!(run(&["-w", "1e-7", "f", "true"]).0.wait, Wait::No);
    assert_eq!(run(&["-w", "5", "-n", "f", "true"]).0.wait, Wait::No);
    assert_eq!(
        run(&["-w", " 0.25", "f", "true"]).0.wait,
        Wait::For(Duration::from_millis(250))
    );
    assert_eq!(
        usage_first(&["-w", "abc", "f", "x"]),
        "invalid timeout value: 'abc'"
    );
    assert_eq!(
        usage_first(&["-w", "", "f", "x"]),
        "invalid timeout value: ''"
    );
    assert_eq!(p(&["-w", "-1", "f", "true"]), Parsed::BadTimer);
    assert_eq!(p(&["-w", "inf", "f", "true"]), Parsed::BadTimer);
    assert_eq!(run(&["-E", "0", "f", "x"]).0.conflict, 0);
    assert_eq!(run(&["-E", "255", "f", "x"]).0.conflict, 255);
    assert_eq!(
        usage_first(&["-E", "256", "f", "x"]),
        "exit code out of range (expected 0 to 255)"
    );
    assert!(usage_first(&["-E", "-1", "f", "x"]).contains("out of range"));
    assert_eq!(
        usage_first(&["-E", "0x10", "f", "x"]),
        "invalid exit code: '0x10'"
    );
    assert_eq!(
        usage_first(&["-oF", "f", "x"]),
        "the --no-fork and --close options are incompatible"
    );
    // Help and version end the parse where they stand.
    assert_eq!(p(&["-h", "--bogus"]), Parsed::Help);
    assert_eq!(p(&["-V", "-z"]), Parsed::Version);
    assert!(matches!(p(&["-z", "-h"]), Parsed::Usage(_)));
}
