//! The flock(1) command line, parsed exactly as util-linux 2.41 parses it.
//!
//! Owns: `getopt_long` semantics with flock's option string `+sexnoFuw:E:hV?` (stop at the first
//! non-option, `--` ends the options, bundled short options, an option's argument attached or
//! next, long options by any unique prefix, `--name=value`), flock's long-option table, the
//! checks flock makes after parsing (`-F` with `-o`, `-c` with exactly one argument, `-E` in
//! 0–255, the timeout), the three forms (`FILE CMD...`, `FILE -c CMD`, `FD`), and the usage and
//! version texts. Must never: touch a file or a lock, or accept a command line flock(1) refuses.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// Which lock to take (`-s`, `-x`/`-e`, `-u`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `-s`: a shared lock.
    Shared,
    /// `-x`, `-e` (the default): an exclusive lock.
    Exclusive,
    /// `-u`: drop the lock.
    Unlock,
}

/// Which kernel lock (`--fcntl` or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `flock(2)` (the default).
    Flock,
    /// `--fcntl`: an open-file-description lock (`F_OFD_SETLK`/`F_OFD_SETLKW`).
    Ofd,
}

/// How long to wait for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until it is had (the default).
    Forever,
    /// `-n`, or `-w 0`: not at all.
    No,
    /// `-w SECONDS` (more than zero).
    For(Duration),
}

/// The options, after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `-s`, `-x`, `-u`: the last one given wins.
    pub mode: Mode,
    /// `-n`, `-w`.
    pub wait: Wait,
    /// `-E N`: the status of a conflict or a timeout (default 1).
    pub conflict: u8,
    /// `-o`: the command does not inherit the lock's descriptor.
    pub close: bool,
    /// `-F`: exec the command in place of flock.
    pub no_fork: bool,
    /// `--fcntl`.
    pub api: Api,
    /// `--verbose`.
    pub verbose: bool,
}

/// What to lock, and what to run under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `flock [opts] FILE|DIR CMD [ARGS]` and `flock [opts] FILE|DIR -c CMD`.
    File {
        /// The file or directory, as given.
        path: OsString,
        /// The command (for `-c`: `$SHELL -c CMD`).
        command: Vec<OsString>,
    },
    /// `flock [opts] FD`: lock (or unlock) an open descriptor and exit.
    Fd(i32),
}

/// The result of parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Lock and run.
    Run(Options, Target),
    /// `-h`/`--help`: print the usage, exit 0.
    Help,
    /// `-V`/`--version`: print the version, exit 0.
    Version,
    /// A usage error: these lines (without the program name), exit 64.
    Usage(Vec<String>),
    /// flock's own timer refuses this timeout (negative, not finite, too large): exit 71.
    BadTimer,
}

/// One long option of flock's table.
struct Long {
    name: &'static str,
    arg: bool,
    key: char,
}

/// util-linux 2.41's long options, in its order ('v' and 'f' stand for the options that have
/// no short form, `--verbose` and `--fcntl`).
const LONGS: &[Long] = &[
    Long {
        name: "shared",
        arg: false,
        key: 's',
    },
    Long {
        name: "exclusive",
        arg: false,
        key: 'x',
    },
    Long {
        name: "unlock",
        arg: false,
        key: 'u',
    },
    Long {
        name: "nonblocking",
        arg: false,
        key: 'n',
    },
    Long {
        name: "nb",
        arg: false,
        key: 'n',
    },
    Long {
        name: "timeout",
        arg: true,
        key: 'w',
    },
    Long {
        name: "wait",
        arg: true,
        key: 'w',
    },
    Long {
        name: "conflict-exit-code",
        arg: true,
        key: 'E',
    },
    Long {
        name: "close",
        arg: false,
        key: 'o',
    },
    Long {
        name: "no-fork",
        arg: false,
        key: 'F',
    },
    Long {
        name: "verbose",
        arg: false,
        key: 'v',
    },
    Long {
        name: "fcntl",
        arg: false,
        key: 'f',
    },
    Long {
        name: "help",
        arg: false,
        key: 'h',
    },
    Long {
        name: "version",
        arg: false,
        key: 'V',
    },
];

/// The short options without an argument, and those with one.
const SHORT_FLAGS: &[u8] = b"sexnoFuhV?";
const SHORT_WITH_ARG: &[u8] = b"wE";

const TRY_HELP: &str = "try-help";

/// A parse step's early end: a finished [`Parsed`] (help, version, an error).
type Step<T> = Result<T, Parsed>;

/// Options read from one argument (`key`, and its value if it takes one), and how many of the
/// arguments after it were used as a value.
type Read = (Vec<(char, Option<OsString>)>, usize);

fn usage(lines: &[String], try_help: bool) -> Parsed {
    let mut v = lines.to_vec();
    if try_help {
        v.push(TRY_HELP.into());
    }
    Parsed::Usage(v)
}

/// Whether a usage line is the "Try 'flock --help'" line (which names the program).
pub fn is_try_help(line: &str) -> bool {
    line == TRY_HELP
}

/// Parses flock's arguments (without the program name).
pub fn parse(args: &[OsString]) -> Parsed {
    if args.is_empty() {
        return usage(&["not enough arguments".into()], true);
    }
    match parse_inner(args) {
        Ok(p) | Err(p) => p,
    }
}

fn parse_inner(args: &[OsString]) -> Step<Parsed> {
    let mut o = Options {
        mode: Mode::Exclusive,
        wait: Wait::Forever,
        conflict: 1,
        close: false,
        no_fork: false,
        api: Api::Flock,
        verbose: false,
    };
    let mut timeout: Option<OsString> = None;
    let mut nonblock = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_bytes();
        if a == b"--" {
            i += 1;
            break;
        }
        if a.len() < 2 || a[0] != b'-' {
            break; // '+': the first non-option ends the options
        }
        let (opts, used) = if a.starts_with(b"--") {
            long(&a[2..], args.get(i + 1))?
        } else {
            short(&a[1..], args.get(i + 1))?
        };
        i += 1 + used;
        for (key, val) in opts {
            apply(key, val, &mut o, &mut timeout, &mut nonblock)?;
        }
    }
    if o.no_fork && o.close {
        return Err(usage(
            &["the --no-fork and --close options are incompatible".into()],
            false,
        ));
    }
    let rest = &args[i..];
    let target = target(rest)?;
    // `-n` wins over `-w` whatever their order; `-w 0` means `-n`.
    o.wait = match timeout {
        None => Wait::Forever,
        Some(t) => match timeout_value(&t)? {
            d if d.is_zero() => Wait::No,
            d => Wait::For(d),
        },
    };
    if nonblock {
        o.wait = Wait::No;
    }
    Ok(Parsed::Run(o, target))
}

/// Applies one parsed option.
fn apply(
    key: char,
    val: Option<OsString>,
    o: &mut Options,
    timeout: &mut Option<OsString>,
    nonblock: &mut bool,
) -> Step<()> {
    match key {
        's' => o.mode = Mode::Shared,
        'e' | 'x' => o.mode = Mode::Exclusive,
        'u' => o.mode = Mode::Unlock,
        'o' => o.close = true,
        'F' => o.no_fork = true,
        'n' => *nonblock = true,
        'w' => {
            let v = val.unwrap_or_default();
            // Its syntax is checked at once, as flock does; a value flock's timer refuses is
            // refused after the other checks, as flock does.
            if let Err(p @ Parsed::Usage(_)) = timeout_value(&v) {
                return Err(p);
            }
            *timeout = Some(v);
        }
        'E' => o.conflict = exit_code(&val.unwrap_or_default())?,
        'f' => o.api = Api::Ofd,
        'v' => o.verbose = true,
        'h' => return Err(Parsed::Help),
        'V' => return Err(Parsed::Version),
        _ => return Err(usage(&[], true)), // '-?'
    }
    Ok(())
}

/// One bundle of short options (`nx`, `w5`, `w` followed by its argument in `next`): the
/// options and how many following arguments were used.
fn short(cluster: &[u8], next: Option<&OsString>) -> Step<Read> {
    let mut out = Vec::new();
    for (k, &c) in cluster.iter().enumerate() {
        if SHORT_FLAGS.contains(&c) {
            out.push((c as char, None));
            continue;
        }
        if SHORT_WITH_ARG.contains(&c) {
            let rest = &cluster[k + 1..];
            if !rest.is_empty() {
                out.push((c as char, Some(OsStr::from_bytes(rest).to_os_string())));
                return Ok((out, 0));
            }
            let Some(v) = next else {
                let m = format!("option requires an argument -- '{}'", c as char);
                return Err(usage(&[m], true));
            };
            out.push((c as char, Some(v.clone())));
            return Ok((out, 1));
        }
        let shown = String::from_utf8_lossy(&cluster[k..k + 1]).into_owned();
        let m = format!("invalid option -- '{}'", shown.escape_debug());
        return Err(usage(&[m], true));
    }
    Ok((out, 0))
}

/// One long option (`nonblock`, `time=3`, `wait` followed by its argument in `next`), by
/// `getopt_long`'s rules: an exact name wins; else a prefix of exactly one option, or of several
/// that all mean the same thing.
fn long(body: &[u8], next: Option<&OsString>) -> Step<Read> {
    let (name, inline) = match body.iter().position(|&b| b == b'=') {
        Some(p) => (&body[..p], Some(&body[p + 1..])),
        None => (body, None),
    };
    let typed = String::from_utf8_lossy(body).into_owned();
    let found = match LONGS.iter().find(|l| l.name.as_bytes() == name) {
        Some(l) => l,
        None => {
            let cands: Vec<&Long> = LONGS
                .iter()
                .filter(|l| l.name.as_bytes().starts_with(name))
                .collect();
            let Some(&first) = cands.first() else {
                return Err(usage(&[format!("unrecognized option '--{typed}'")], true));
            };
            let differ: Vec<&Long> = cands
                .iter()
                .copied()
                .filter(|l| l.key != first.key || l.arg != first.arg)
                .collect();
            if !differ.is_empty() {
                let mut m = format!("option '--{typed}' is ambiguous; possibilities:");
                for l in std::iter::once(first).chain(differ) {
                    m.push_str(&format!(" '--{}'", l.name));
                }
                return Err(usage(&[m], true));
            }
            first
        }
    };
    match (found.arg, inline) {
        (false, Some(_)) => {
            let m = format!("option '--{}' doesn't allow an argument", found.name);
            Err(usage(&[m], true))
        }
        (false, None) => Ok((vec![(found.key, None)], 0)),
        (true, Some(v)) => Ok((
            vec![(found.key, Some(OsStr::from_bytes(v).to_os_string()))],
            0,
        )),
        (true, None) => match next {
            Some(v) => Ok((vec![(found.key, Some(v.clone()))], 1)),
            None => {
                let m = format!("option '--{}' requires an argument", found.name);
                Err(usage(&[m], true))
            }
        },
    }
}

/// The form, from the arguments left after the options.
fn target(rest: &[OsString]) -> Step<Target> {
    match rest {
        [] => Err(usage(
            &["requires file descriptor, file or directory".into()],
            false,
        )),
        [fd] => match c_long(fd) {
            Some(n) => Ok(Target::Fd(n)),
            None => Err(usage(
                &[format!("bad file descriptor: '{}'", fd.to_string_lossy())],
                false,
            )),
        },
        [path, flag, tail @ ..] if flag == "-c" || flag == "--command" => {
            if tail.len() != 1 {
                let m = format!(
                    "{} requires exactly one command argument",
                    flag.to_string_lossy()
                );
                return Err(usage(&[m], false));
            }
            let shell = std::env::var_os("SHELL")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "/bin/sh".into());
            Ok(Target::File {
                path: path.clone(),
                command: vec![shell, "-c".into(), tail[0].clone()],
            })
        }
        [path, command @ ..] => Ok(Target::File {
            path: path.clone(),
            command: command.to_vec(),
        }),
    }
}

/// A decimal `int` as `strtol` reads it whole (leading blanks and a sign allowed).
fn c_long(s: &OsStr) -> Option<i32> {
    let t = s
        .to_str()?
        .trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.strip_prefix('+').unwrap_or(t).parse().ok()
}

/// `-E N`: 0–255.
fn exit_code(s: &OsStr) -> Step<u8> {
    let Some(n) = c_long(s) else {
        let m = format!("invalid exit code: '{}'", s.to_string_lossy());
        return Err(usage(&[m], false));
    };
    u8::try_from(n).map_err(|_| {
        usage(
            &["exit code out of range (expected 0 to 255)".into()],
            false,
        )
    })
}

/// `-w SECONDS`: a decimal number, fractions allowed, truncated to microseconds as flock does
/// (so `-w 0.0000001` is `-w 0`, non-blocking). A negative or non-finite value is refused the
/// way flock's timer refuses it ([`Parsed::BadTimer`]).
pub fn timeout_value(s: &OsStr) -> Step<Duration> {
    let bad = || {
        let m = format!("invalid timeout value: '{}'", s.to_string_lossy());
        usage(&[m], false)
    };
    let t = s
        .to_str()
        .ok_or_else(bad)?
        .trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let v: f64 = t.parse().map_err(|_| bad())?;
    if v.is_nan() {
        return Err(bad());
    }
    if !(0.0..=1e12).contains(&v) {
        return Err(Parsed::BadTimer);
    }
    let secs = v.trunc();
    let micros = ((v - secs) * 1e6) as u64;
    Ok(Duration::from_secs(secs as u64) + Duration::from_micros(micros))
}

/// flock(1)'s options as its help lists them: (the option column, what it does). The help text
/// and the `flock` manual page (`leasehold --generate man-flock`) are both made from this list.
pub const OPTIONS: &[(&str, &str)] = &[
    ("-s, --shared", "get a shared lock"),
    ("-x, --exclusive", "get an exclusive lock (default)"),
    ("-u, --unlock", "remove a lock"),
    ("-n, --nonblock", "fail rather than wait"),
    ("-w, --timeout <secs>", "wait for a limited amount of time"),
    (
        "-E, --conflict-exit-code <number>",
        "exit code after conflict or timeout",
    ),
    (
        "-o, --close",
        "close file descriptor before running command",
    ),
    (
        "-c, --command <command>",
        "run a single command string through the shell",
    ),
    ("-F, --no-fork", "execute command without forking"),
    ("    --fcntl", "use fcntl(F_OFD_SETLK) rather than flock()"),
    ("    --verbose", "increase verbosity"),
];

/// The three forms of the command line, with `{prog}` for the program name.
pub const FORMS: &[&str] = &[
    "{prog} [options] <file>|<directory> <command> [<argument>...]",
    "{prog} [options] <file>|<directory> -c <command>",
    "{prog} [options] <file descriptor number>",
];

/// The exit statuses, as the help and the manual page say them.
pub const EXIT_STATUS: &str = "the command's; 1 (or -E) on a conflict or timeout; 64 usage, 65 \
     lock, 66 open, 69 cannot execute, 71 system error, 73 cannot create; 74 the lease was lost \
     and the command stopped.";

/// Examples, as (command line after the program name, what it does): the `flock` manual page's
/// EXAMPLES and `leasehold flock`'s entry in `leasehold --help`.
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "flock -n /var/lock/backup.lock /usr/local/bin/backup",
        "skip this run (exit 1) if the last backup still runs",
    ),
    (
        "flock -w 10 /var/lock/deploy.lock -c 'make deploy'",
        "wait up to 10 seconds for the lock, then give up (exit 1)",
    ),
    (
        "flock -s /var/lock/db.lock ./read-report.sh",
        "a shared lock: readers run together, an exclusive holder waits for them all",
    ),
    (
        "flock -n 9 || exit 1",
        "the descriptor form, in a shell block run as { ...; } 9>/var/lock/job.lock: the lock \
         (and its lease) is held until the block's descriptor 9 is closed",
    ),
];

/// One option line in flock(1)'s two columns.
fn option_line(left: &str, what: &str) -> String {
    if left.len() >= 25 {
        format!(" {left}  {what}\n")
    } else {
        format!(" {left:<25}{what}\n")
    }
}

/// The `--help` text, in flock(1)'s shape.
pub fn help_text(prog: &str) -> String {
    let mut s = String::from("\nUsage:\n");
    for f in FORMS {
        s.push_str(&format!(" {}\n", f.replace("{prog}", prog)));
    }
    s.push_str(
        "\nManage file locks from shell scripts (leasehold's flock(1)-compatible front end: the\n\
         kernel lock flock(1) takes; with LEASEHOLD_FLOCK_FENCE=1 also a heartbeat lease\n\
         beside the file, and fencing; see leasehold(1)).\n\
         \nOptions:\n",
    );
    for (left, what) in OPTIONS {
        s.push_str(&option_line(left, what));
    }
    s.push('\n');
    s.push_str(&option_line("-h, --help", "display this help"));
    s.push_str(&option_line("-V, --version", "display version"));
    s.push_str(
        "\nExit status: the command's; 1 (or -E) on a conflict or timeout; 64 usage, 65 lock,\n\
         66 open, 69 cannot execute, 71 system error, 73 cannot create; 74 the lease was lost\n\
         and the command stopped.\n\nFor more details see flock(1) and leasehold(1).\n",
    );
    s
}

/// The `--version` line.
pub fn version_text(prog: &str) -> String {
    format!(
        "{prog} from leasehold {} (compatible with util-linux 2.41 flock)\n",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests;
