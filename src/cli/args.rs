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

/// The exit statuses of `run`, one per line: in `leasehold --help`, `run --help` and the man
/// page alike (a macro, so that `concat!` can build the texts from one list).
macro_rules! run_exit_codes {
    () => {
        "  N        the command's own exit status
  128+N    the command died of signal N
  75       the lock could not be had (--no-wait, or --wait ran out), or --once-per: the last
           start was less than its DURATION ago; see -E
  74       the lease was lost (taken, or could not be renewed) and the command was fenced
  79       --after-crash fail: the last holding ended uncleanly (fenced, died, broken); the
           command was not run until `leasehold ack LOCK`
  124      --max-time ran out: the command was fenced (TERM, grace, KILL), as timeout(1) exits
  64       usage error (bad flag, DURATION, no command, or timing that cannot fit)
  65       LOCK exists but is not a leasehold lease (other content, symlink, directory, FIFO),
           or something not leasehold's own sits at a helper name (.LOCK.leasehold-*)
  66       cannot open LOCK or its directory
  69       an etcd:// or s3:// LOCK's store could not serve us (no endpoint reachable, no leader);
           a waiting run asks again until --wait runs out, then exits 75
  70       internal error
  73       cannot create a file, or no space
  77       permission denied (leasehold needs write access to LOCK's directory), or a helper
           file of another user it may not share
  78       LOCK's file system or store cannot make the lock safe (NFS with host-local locks,
           an S3 server that ignores conditional writes)
  126/127  the command could not be run / was not found"
    };
}

/// What a DURATION is (a macro for `concat!`, like [`run_exit_codes`]).
macro_rules! duration_help {
    () => {
        "DURATION is a number of seconds (`1.5`, as flock -w takes it) or numbers with units: `500ms`,
`30s`, `5m`, `2h`, `1d`, combined as `1h30m`."
    };
}

/// What LOCK may be, as every subcommand's help says it (a macro for `concat!`).
macro_rules! lock_forms {
    () => {
        "LOCK is a file (created if missing; its directory must exist), or etcd://[HOST:PORT,...]/NAME
for a lock on an etcd cluster (leasehold built with --features etcd; ETCDCTL_ENDPOINTS and the
other ETCDCTL_* variables as etcdctl takes them), or s3://BUCKET/KEY for a lock on S3 or an
S3-compatible server (built with --features s3; AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID and the
other AWS_* variables and ~/.aws files as the aws command takes them)."
    };
}

/// The exit statuses of every subcommand (a macro for `concat!`).
macro_rules! exit_codes {
    () => {
        concat!(
            "Exit status of `run`:\n",
            run_exit_codes!(),
            "
`lock` exits as `run` does (0: held); `unlock` exits 0 when released, 77 when refused, 75 when
its keeper is gone; `status` exits 0 when every LOCK could be read; `break` exits 75 when it
refuses; `ack` exits 0 when recorded, 75 when there is nothing to acknowledge; `flock` exits
as util-linux's flock(1) does.
See `leasehold run --help` (and lock, unlock, status, break, flock) for examples;
`leasehold --generate man` (and man-flock) for the manual pages."
        )
    };
}

/// The exit statuses of every subcommand: the manual page's EXIT STATUS.
pub const EXIT_CODES: &str = exit_codes!();

/// The end of `leasehold --help`: what LOCK may be, and every exit status.
const TOP_HELP: &str = concat!(lock_forms!(), "\n\n", exit_codes!());

/// What LOCK may be: a file, an etcd:// or an s3:// URL.
pub const LOCK_FORMS: &str = lock_forms!();

/// What a DURATION is, as `run --help` and the man page explain it.
pub const DURATION_HELP: &str = duration_help!();

/// The end of `leasehold run --help`: LOCK, DURATION, its exit statuses, examples.
const RUN_HELP: &str = concat!(
    lock_forms!(),
    "\n\n",
    duration_help!(),
    "\n\nExit status:\n",
    run_exit_codes!(),
    "

Examples:
  leasehold run -n /var/lock/backup.lock -- /usr/local/bin/backup --full
      skip this run (exit 75) if the last backup still runs
  leasehold run -w 5m --note \"CI run $CI_PIPELINE_ID\" /srv/deploy.lock -c 'make deploy'
      wait up to 5 minutes, then give up; `status` and waiters show the note
  leasehold run --ttl 10s /mnt/nfs/jobs/report.lock -- ./report.sh
      a shorter TTL: a dead holder on another host is noticed after 10s
  leasehold run -n etcd://10.0.0.1:2379,10.0.0.2:2379/reports -- ./report.sh
      once across every host sharing that etcd cluster
  leasehold run -n --max-time 4h /var/lock/backup.lock -- ./backup.sh
      a hung backup is fenced after 4 hours (exit 124) instead of blocking every night after
  leasehold run --after-crash fail /srv/tf.lock -- terraform apply -auto-approve
      refuse (exit 79) after a crashed, fenced or broken apply until `leasehold ack /srv/tf.lock`
  leasehold run -n -E 0 --once-per 1h /shared/hourly.lock -- ./hourly.sh
      at most one start per hour across every host using the lock

The command gets LEASEHOLD_PREVIOUS (none, released, fenced, died or broken),
LEASEHOLD_PREVIOUS_STATUS (the exit status when released; 128+N for signal N; else empty),
LEASEHOLD_PREVIOUS_HOST, LEASEHOLD_PREVIOUS_TOKEN and LEASEHOLD_PREVIOUS_ENDED (RFC 3339):
how the holding before it ended."
);

/// The end of `leasehold status --help`: its exit statuses, examples.
const STATUS_HELP: &str = concat!(
    lock_forms!(),
    "

Exit status:
  0        every LOCK could be read (free, held, stale or hung: the state is in the output;
           a LOCK that does not exist is shown free, and nothing is created)
  65       LOCK is not a leasehold lease;  66  its directory cannot be opened
  77       permission denied;              70  internal error
  (with several LOCKs, the first failure's status)

Examples:
  leasehold status /srv/deploy.lock
      who holds it, since when, its lease id, how long this host has seen its heartbeat
  leasehold status --json /srv/deploy.lock | jq -r .state
      free, held, stale or hung (several LOCKs: an array of objects)"
);

/// The end of `leasehold break --help`: its exit statuses, examples.
const BREAK_HELP: &str = concat!(
    lock_forms!(),
    "

Without --lease-id or --force only a stale lease is broken (its holder's processes are gone,
or it has been silent a full TTL). A live lease broken by id or by force is revoked: its
holder fences its command at its next renewal; the lock frees once the old job is gone.

Exit status:
  0        broken (or revoked) as asked
  75       refused: the lease is live (name its id, or --force), the id does not match, or
           nothing is there to break
  65, 66, 70, 77  as for `run`

Examples:
  leasehold break /srv/deploy.lock
      break it only if it is stale
  leasehold break --lease-id 6f1c0e9a2b7d4c85a3e1f0b2c4d6e8fa /srv/deploy.lock
      revoke exactly that lease (the id is in `status` and in the job's $LEASEHOLD_LEASE_ID)"
);

/// The end of `leasehold ack --help`: its exit statuses, examples.
const ACK_HELP: &str = "\
Exit status:
  0        recorded (or acknowledged already)
  75       refused: the lock is held, keeps no ending, or its last ending was clean
  65, 66, 70, 77  as for `run`

Examples:
  leasehold status /srv/tf.lock && leasehold ack /srv/tf.lock
      look at how the last apply ended, check what it left, then let the next run go";

/// The end of `leasehold unlock --help`: its exit statuses, examples.
const UNLOCK_HELP: &str = "\
Only the script that took the lease with `leasehold lock`, or a process it started, may unlock
it (as the same user); anyone else uses `leasehold break`.

Exit status:
  0        released (or nothing was held)
  77       refused: the lease was not taken by `leasehold lock`, is held by a script on another
           host, or this process is neither its script nor started by it
  75       its keeper is gone (the lease is judged as a frozen holder's: `break --force` frees
           it), or did not release in time
  65, 66, 70  as for `run`

Examples:
  leasehold unlock /run/lock/job.lock
      release the script's lease now, before the script exits
  leasehold unlock -q \"$LEASEHOLD_LOCK\"
      the same from a process the script started, silent unless refused";

/// The end of `leasehold flock` in `leasehold --help`'s terms (the front end itself prints
/// flock(1)'s own help): what it is, its exit statuses and examples, from the front end's lists.
fn flock_help() -> String {
    use crate::flock::args::{EXAMPLES, EXIT_STATUS};
    let mut s = String::from(
        "util-linux 2.41 flock(1)'s command line and behaviour (with LEASEHOLD_FLOCK_FENCE=1 also
a heartbeat lease, in the runtime directory or on NFS beside the file, and fencing): `leasehold flock --help`
for its options, `leasehold --generate
man-flock` for its manual page. Also called as `flock` (ln -s leasehold flock).

Exit status: ",
    );
    s.push_str(EXIT_STATUS);
    s.push_str("\n\nExamples:\n");
    for (example, what) in EXAMPLES {
        s.push_str(&format!("  leasehold {example}\n      {what}\n"));
    }
    s.truncate(s.trim_end().len());
    s
}

/// `leasehold`: guard a job with a heartbeat lease on a file.
#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Guard a job with a heartbeat lease on a file: stale locks broken safely, holders fenced, fencing tokens",
    after_help = TOP_HELP,
    subcommand_required = false,
    arg_required_else_help = true,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Print a manual page (roff) or a shell completion script on stdout, and exit.
    #[arg(long, value_name = "KIND", value_enum)]
    pub generate: Option<Generate>,
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What `--generate` prints (as ripgrep's `--generate` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Generate {
    /// leasehold(1), as roff: `leasehold --generate man > leasehold.1`.
    Man,
    /// flock(1) for the `flock` name (leasehold's flock-compatible front end), as roff.
    ManFlock,
    /// A bash completion script.
    CompleteBash,
    /// A zsh completion script (`_leasehold`).
    CompleteZsh,
    /// A fish completion script.
    CompleteFish,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding the lease on LOCK; fence it if the lease is lost.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Show who holds each LOCK, and since when.
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Take the lease on LOCK for the calling script; print `export` lines for `eval`.
    #[command(after_help = LOCK_HELP)]
    Lock(LockArgs),
    /// Release early a lease taken by `leasehold lock` (from the script or a process it started).
    #[command(after_help = UNLOCK_HELP)]
    Unlock(UnlockArgs),
    /// Break the lease on LOCK: a stale one, one named by its id, or (--force) any.
    #[command(name = "break", after_help = BREAK_HELP)]
    Break(BreakArgs),
    /// Acknowledge an unclean end of LOCK's last holding (fenced, died, broken), recording who
    /// and when: `run --after-crash fail` runs again, `--recover` is not run for it.
    #[command(after_help = ACK_HELP)]
    Ack(AckArgs),
    /// flock(1)'s command line (util-linux), with a lease beside the file: waiters are told who
    /// holds it, and `status` and `break` work on it.
    #[command(
        after_help = flock_help(),
        disable_help_flag = true,
        override_usage = "leasehold flock [options] <file>|<directory> <command> [<argument>...]\n       leasehold flock [options] <file>|<directory> -c <command>\n       leasehold flock [options] <file descriptor number>"
    )]
    Flock(FlockArgs),
}

/// `leasehold flock ARGS...`: parsed by the flock front end (`crate::flock::args`), not clap;
/// listed here so that `--help`, the manual page and the completions name it.
#[derive(Debug, Args)]
pub struct FlockArgs {
    /// flock(1)'s options and arguments.
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..
    )]
    pub args: Vec<OsString>,
}

/// The options of a lease that `run` and `lock` share: how long to wait, its timing, its note,
/// shared or counted, and polling.
#[derive(Debug, Args)]
pub struct LeaseOpts {
    /// Fail at once if the lock is held.
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub no_wait: bool,
    /// Give up after DURATION (default: wait forever).
    #[arg(short = 'w', long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Lease time-to-live: how long a silent holder is waited for (at most 24h).
    // Its default's one home is `leasehold::DEFAULT_TTL_TEXT`.
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration, default_value = leasehold::DEFAULT_TTL_TEXT)]
    pub ttl: Duration,
    /// Renewal interval (default: `leasehold::heartbeat_rule`).
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration,
          help = format!("Renewal interval [default: {}]", leasehold::heartbeat_rule()))]
    pub heartbeat: Option<Duration>,
    /// SIGTERM-to-SIGKILL grace when fencing (default: `leasehold::grace_rule`).
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_duration,
          help = format!("SIGTERM-to-SIGKILL grace when fencing [default: {}]", leasehold::grace_rule()))]
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
}

impl LeaseOpts {
    /// `b` with these settings: TTL, heartbeat, grace, note, shared or slots, polling.
    pub fn apply(&self, mut b: leasehold::LeaseBuilder) -> leasehold::LeaseBuilder {
        b = b.ttl(self.ttl).poll(self.poll).shared(self.shared);
        if let Some(h) = self.heartbeat {
            b = b.heartbeat(h);
        }
        if let Some(g) = self.grace {
            b = b.grace(g);
        }
        if let Some(n) = &self.note {
            b = b.note(n.clone());
        }
        if let Some(n) = self.slots {
            b = b.slots(n);
        }
        b
    }
}

/// `leasehold run [OPTIONS] LOCK -- CMD [ARGS...]` or `leasehold run [OPTIONS] LOCK -c 'SHELL COMMAND'`.
#[derive(Debug, Args)]
#[command(
    override_usage = "leasehold run [OPTIONS] LOCK -- CMD [ARGS...]\n       leasehold run [OPTIONS] LOCK -c 'SHELL COMMAND'"
)]
pub struct RunArgs {
    #[command(flatten)]
    pub lease: LeaseOpts,
    /// Print only errors.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Also print the token and lease id on acquiring, and how the lease was released.
    #[arg(short, long)]
    pub verbose: bool,
    /// Report on stderr as one JSON object a line, one per event (waiting, acquired, broke,
    /// refused, fenced, released, ...; every event, whatever -q or -v say): docs/json.md.
    #[arg(long)]
    pub json: bool,
    /// The lock file (created if missing; its directory must exist).
    #[arg(value_name = "LOCK")]
    pub lock: PathBuf,
    /// Run SHELL COMMAND with `/bin/sh -c` instead of CMD.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL COMMAND",
        conflicts_with = "cmd"
    )]
    pub shell: Option<String>,
    /// The command and its arguments, after `--` (or use -c).
    #[arg(value_name = "CMD", last = true)]
    pub cmd: Vec<OsString>,
    /// Fence the command once it has run DURATION (TERM, grace, KILL of its group) and exit
    /// 124, as timeout(1) does; `status` shows the deadline.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_time: Option<Duration>,
    /// After an unclean end of the last holding (fenced, died, broken): `run` the command
    /// anyway, or `fail` (exit 79, naming the ending) until `leasehold ack LOCK`.
    #[arg(long, value_name = "WHAT", value_enum, default_value = "run")]
    pub after_crash: AfterCrash,
    /// After an unclean end of the last holding (not acknowledged), run SHELL COMMAND under the
    /// lease first (with the command's environment and LEASEHOLD_PREVIOUS*): if it fails, exit
    /// with its status without running the command.
    #[arg(long, value_name = "SHELL COMMAND")]
    pub recover: Option<String>,
    /// At most one start per DURATION across every host using LOCK: a start within DURATION
    /// of the last one exits 75 (or -E's status), saying when the next is allowed.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub once_per: Option<Duration>,
}

/// `run --after-crash`: what to do after an unclean end of the last holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AfterCrash {
    /// Run the command (it sees LEASEHOLD_PREVIOUS).
    Run,
    /// Do not run it: exit 79 until `leasehold ack LOCK`.
    Fail,
}

/// `leasehold ack LOCK`.
#[derive(Debug, Args)]
pub struct AckArgs {
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// The lock file.
    #[arg(value_name = "LOCK")]
    pub lock: PathBuf,
}

/// How `leasehold lock` is used, printed after its `--help`.
pub const LOCK_HELP: &str = concat!(
    lock_forms!(),
    "

Script mode:
  out=$(leasehold lock -n /run/lock/job.lock) || exit $?
  eval \"$out\"      # sets LEASEHOLD_LOCK, LEASEHOLD_TOKEN, LEASEHOLD_LEASE_ID, LEASEHOLD_PREVIOUS*
  ...               # the work; the lease is released when the script exits
  leasehold unlock /run/lock/job.lock   # optional: release it early
Do not write eval \"$(leasehold lock ...)\" || exit: eval of an empty string succeeds, so a
failed lock would not stop the script. A keeper process renews the lease, releases it when the
script exits, and stops the script (TERM, grace, KILL; its process group when it leads one)
if the lease is lost. A script with a controlling terminal is never signalled: it is told on
that terminal.

Exit status:
  0        held: the `export` lines are on stdout
  75       the lock could not be had (--no-wait, or --wait ran out); see -E
  64, 65, 66, 70, 73, 77, 78  as for `run`

Examples:
  leasehold lock -n /run/lock/job.lock
      in a script, as out=$(...) || exit $?: skip the rest of it if the lock is held
  leasehold lock -w 1m --note nightly /run/lock/job.lock
      wait up to a minute (the `export` lines to `eval`)"
);

/// `leasehold lock [OPTIONS] LOCK`: the lease for the calling process.
#[derive(Debug, Args)]
pub struct LockArgs {
    #[command(flatten)]
    pub lease: LeaseOpts,
    /// Hold the lease for process PID instead of the caller (the parent of `leasehold lock`).
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// The lock file (created if missing; its directory must exist).
    #[arg(value_name = "LOCK")]
    pub lock: PathBuf,
}

/// `leasehold unlock LOCK`.
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// The lock file.
    #[arg(value_name = "LOCK")]
    pub lock: PathBuf,
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
