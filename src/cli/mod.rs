//! The command-line interface: `leasehold run`, `lock`, `unlock`, `status` and `break`, mapped
//! onto the library.
//!
//! Owns: parsing the command line (see [`args`]), choosing the subcommand, and turning every
//! outcome into exactly one exit status (usage errors are 64, never clap's 2). Must never: hold
//! protocol logic (that lives in the library: `LeaseBuilder`, `status`, `break_lease`,
//! `supervise`), or panic on any input.

/// Writes one line to stderr, ignoring failure (a closed or broken stderr must not turn into a
/// panic; the exit status still tells what happened). The line is passed through
/// [`leasehold::text::scrub`] as a whole — no legitimate single line holds a control character —
/// so that nothing printed here can rewrite the terminal or start a line of its own, even if a
/// caller forgot to escape a value (the `report` functions escape each value already).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", leasehold::text::scrub(&line));
    }};
}

/// Writes to stdout, ignoring failure (e.g. `leasehold status | head -1`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

pub mod args;
mod brk;
pub mod duration;
pub(crate) mod ending;
pub(crate) mod events;
pub mod exit;
pub mod generate;
pub mod json;
mod lock;
pub(crate) mod previous;
pub(crate) mod progress;
pub mod report;
pub(crate) mod run;
mod status;
mod unlock;

use clap::Parser;
use clap::error::ErrorKind;

/// Runs the `leasehold` command line with this process's arguments and returns its exit status.
pub fn main() -> i32 {
    main_from(std::env::args_os())
}

/// Runs the command line with the given arguments (the first is the program name).
pub fn main_from<I, T>(argv: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    // A guardian re-executed by a multi-threaded wrapper (`supervise/guardian.rs`).
    if argv
        .get(1)
        .is_some_and(|a| a == crate::supervise::guardian::ARG)
    {
        return crate::supervise::guardian::main();
    }
    // Called as `flock` (e.g. `ln -s leasehold flock`), or `leasehold flock ARGS...`: flock(1)'s
    // command line, not clap's.
    let name = argv.first().map(std::path::Path::new);
    if name
        .and_then(|n| n.file_name())
        .is_some_and(|n| n == "flock")
    {
        return crate::flock::main("flock", &argv[1..]);
    }
    if argv.get(1).is_some_and(|a| a == "flock") {
        return crate::flock::main("leasehold flock", &argv[2..]);
    }
    let cli = match args::Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    0
                }
                _ => {
                    // A usage error quotes the offending argument, which may come from anywhere:
                    // shown plain, with the arguments in it escaped.
                    let styled = e.render().ansi().to_string();
                    for line in report::usage_error_lines(&styled, &argv) {
                        say!("{line}");
                    }
                    // `run LOCK CMD`: the command was taken for an unexpected argument. Not for
                    // a mistyped option (`--no-wiat`) or when `--` was given: the hint would be
                    // false.
                    if command_without_dashes(&e, &argv) {
                        say!("{}", report::no_command_line());
                    }
                    exit::USAGE
                }
            };
        }
    };
    if let Some(kind) = cli.generate {
        return match generate::generate(kind, &mut std::io::stdout().lock()) {
            Ok(()) => 0,
            Err(e) => {
                say!("{}", report::stdout_error_line(&e));
                exit::SOFTWARE
            }
        };
    }
    match cli.command {
        Some(args::Command::Run(a)) if a.argv().is_empty() => {
            say!("{}", report::no_command_line());
            exit::USAGE
        }
        Some(args::Command::Run(a)) => run::run(&a),
        Some(args::Command::Status(a)) => status::status(&a),
        Some(args::Command::Lock(a)) => lock::lock(&a),
        Some(args::Command::Unlock(a)) => unlock::unlock(&a),
        Some(args::Command::Break(a)) => brk::brk(&a),
        Some(args::Command::Ack(a)) => ending::ack(&a),
        // Taken before clap above (`argv[1] == "flock"`); reached only if clap saw it anyway.
        Some(args::Command::Flock(a)) => crate::flock::main("leasehold flock", &a.args),
        // clap shows the help when nothing is given; `--generate` was handled above.
        None => exit::USAGE,
    }
}

/// True when a usage error of `run` is its command given without `--` (`run LOCK echo hi`):
/// clap took the command's first word for an unexpected argument. False for a mistyped option
/// (`--no-wiat`, `-x`) and once `--` is on the line, where "put it after `--`" would be false.
fn command_without_dashes(e: &clap::Error, argv: &[std::ffi::OsString]) -> bool {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != ErrorKind::UnknownArgument
        || argv.get(1).is_none_or(|a| a != "run")
        || argv.iter().skip(2).any(|a| a == "--")
    {
        return false;
    }
    match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => !arg.starts_with('-'),
        _ => false,
    }
}
