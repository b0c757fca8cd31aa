//! The command-line grammar: subcommands, flags and their help text (clap derive).
//!
//! Owns: what `leasehold` accepts and how `--help` describes it, including the list of exit
//! statuses. Must never: act on what it parses (that is `cli::run`, `cli::status`, `cli::brk`),
//! or let clap choose an exit status (usage errors are 64, mapped in `cli::main`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use super::duration::parse_duration;

/// The exit statuses, as printed at the end of `--help`.
pub const EXIT_CODES: &str = "\
Exit status of `run`:
  N        the command's own exit status
  128+N    the command died of signal N
  75       the lock could not be had (--no-wait, or --wait ran out); see -E
  74       the lease was lost (taken, or could not be renewed) and the command was fenced
  64       usage error (bad flag, DURATION, or timing that cannot fit)
  65       LOCK exists but is not a leasehold lease (other content, symlink, directory, FIFO),
           or something not leasehold's own sits at a helper name (.LOCK.leasehold-*)
  66       cannot open LOCK or its directory
  70       internal error
  73       cannot create a file, or no space
  77       permission denied, or a helper file of another user it may not share
  78       LOCK's file system cannot make the lock safe (NFS with host-local locks)
  126/127  the command could not be run / was not found
`status` exits 0 when every LOCK could be read; `break` exits 75 when it refuses.";

/// `leasehold`: guard a job with a heartbeat lease on a file.
#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Guard a job with a heartbeat lease on a file: stale locks broken safely, holders fenced, fencing tokens",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding the lease on LOCK; fence it if the lease is lost.
    #[command(after_help = EXIT_CODES)]
    Run(RunArgs),
    /// Show who holds each LOCK, and since when.
    #[command(after_help = EXIT_CODES)]
    Status(StatusArgs),
    /// Break the lease on LOCK: a stale one, one named by its id, or (--force) any.
    #[command(name = "break", after_help = EXIT_CODES)]
    Break(BreakArgs),
}

/// `leasehold run [OPTIONS] LOCK -- CMD [ARGS...]` or `leasehold run [OPTIONS] LOCK -c 'SHELL COMMAND'`.
#[derive(Debug, Args)]
#[command(
    override_usage = "leasehold run [OPTIONS] LOCK -- CMD [ARGS...]\n       leasehold run [OPTIONS] LOCK -c 'SHELL COMMAND'"
)]
pub struct RunArgs {
    /// Fail at once if the lock is held.
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub no_wait: bool,
    /// Give up after DURATION (default: wait forever).
    #[arg(short = 'w', long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Lease time-to-live.
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration, default_value = "30s")]
    pub ttl: Duration,
    /// Renewal interval [default: TTL/3].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration)]
    pub heartbeat: Option<Duration>,
    /// SIGTERM-to-SIGKILL grace when fencing [default: min(5s, TTL/4)].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// Exit status when the lock could not be had.
    #[arg(short = 'E', long, value_name = "N", default_value_t = 75)]
    pub conflict_exit_code: u8,
    /// Free text stored in the lease (shown by `status`).
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Hold a shared lease: any number of --shared holders run together; a plain `run` on the
    /// same LOCK is exclusive and waits for them all (and they for it), in arrival order.
    #[arg(long, conflicts_with = "slots")]
    pub shared: bool,
    /// Hold one of N slots: at most N commands run at once (a counting semaphore). Every
    /// holder of LOCK must give the same N.
    #[arg(long, value_name = "N")]
    pub slots: Option<u32>,
    /// Poll instead of waiting for change notifications (for NFS).
    #[arg(long)]
    pub poll: bool,
    /// Print only errors.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Also print the token and lease id on acquiring, and how the lease was released.
    #[arg(short, long)]
    pub verbose: bool,
    /// The lock file (created if missing; its directory must exist).
    #[arg(value_name = "LOCK")]
    pub lock: PathBuf,
    /// Run SHELL COMMAND with `/bin/sh -c` instead of CMD.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL COMMAND",
        conflicts_with = "cmd",
        required_unless_present = "cmd"
    )]
    pub shell: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(value_name = "CMD", last = true)]
    pub cmd: Vec<OsString>,
}

/// `leasehold status [--json] LOCK...`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One JSON object per LOCK (an array for several).
    #[arg(long)]
    pub json: bool,
    /// The lock files.
    #[arg(value_name = "LOCK", required = true)]
    pub locks: Vec<PathBuf>,
}

/// `leasehold break [--lease-id ID] [--force] LOCK`.
#[derive(Debug, Args)]
pub struct BreakArgs {
    /// Break the lease only if its id is ID, live or not (naming the id is the confirmation).
    #[arg(long, value_name = "ID", conflicts_with = "force")]
    pub lease_id: Option<String>,
    /// Break whatever lease is there, even a live one (its holder fences its command).
    #[arg(long)]
    pub force: bool,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// The lock file.
    #[arg(value_name = "LOCK")]
    pub lock: PathBuf,
}

impl RunArgs {
    /// The argv to run: CMD as given, or `/bin/sh -c 'SHELL COMMAND'`.
    pub fn argv(&self) -> Vec<OsString> {
        match &self.shell {
            Some(c) => vec!["/bin/sh".into(), "-c".into(), c.into()],
            None => self.cmd.clone(),
        }
    }
}
