//! `leasehold --generate KIND`: the manual page and the shell completions, made from the
//! command-line grammar itself (as ripgrep's `--generate` does), so that they cannot drift from
//! what `leasehold` accepts.
//!
//! Owns: leasehold(1) as roff — every subcommand with its options, exit statuses and examples,
//! LOCK (a file or etcd://), DURATION, the top-level options, the exit statuses, the environment the command gets, the
//! files kept beside LOCK — and the bash, zsh and fish completion scripts (`clap_complete`).
//! Must never: describe a flag by hand that clap already knows (options come from `args`), or
//! write anywhere but the writer given. The page for the `flock` name (`man-flock`) is made from
//! the `flock` front end's own option, exit-status and example lists (`crate::flock::args`), for
//! the same reason.

use std::io::{self, Write};

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};

use super::args::{Cli, DURATION_HELP, EXIT_CODES, Generate, LOCK_FORMS};

/// Writes what `kind` asks for to `w`.
pub fn generate(kind: Generate, w: &mut dyn Write) -> io::Result<()> {
    let mut cmd = Cli::command();
    let shell = match kind {
        Generate::Man => return man_leasehold(w),
        Generate::ManFlock => return man_flock(w),
        Generate::CompleteBash => Shell::Bash,
        Generate::CompleteZsh => Shell::Zsh,
        Generate::CompleteFish => Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "leasehold", w);
    Ok(())
}

/// The environment a guarded command gets, as (variable, meaning).
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "LEASEHOLD_LOCK",
        "the absolute LOCK path (directory part canonicalised, final component never followed)",
    ),
    (
        "LEASEHOLD_TOKEN",
        "the fencing token, decimal: strictly greater than every earlier holder's; pass it to \
         the resource you guard so that it can refuse a late write from an older holder",
    ),
    (
        "LEASEHOLD_LEASE_ID",
        "this holding's random id (32 hex digits), for leasehold break --lease-id",
    ),
    (
        "LEASEHOLD_PREVIOUS",
        "how the holding before this one ended: none (never held, or LOCK emptied), released \
         (the command ended by itself), fenced (lease lost, or --max-time), died (taken over \
         from a dead or silent holder) or broken (leasehold break)",
    ),
    (
        "LEASEHOLD_PREVIOUS_STATUS",
        "when released: its exit status (128+N for signal N; empty when not known); else empty",
    ),
    (
        "LEASEHOLD_PREVIOUS_HOST",
        "the host the previous holding ran on (empty with none)",
    ),
    (
        "LEASEHOLD_PREVIOUS_TOKEN",
        "the previous holding's fencing token (empty with none)",
    ),
    (
        "LEASEHOLD_PREVIOUS_ENDED",
        "when it ended, RFC 3339 (for a takeover or a hand-over: when the next holder found it \
         ended; empty with none)",
    ),
];

/// The files leasehold keeps beside LOCK, as (name, role). NAME is LOCK's file name.
pub const FILES: &[(&str, &str)] = &[
    (
        "LOCK",
        "the JSON lease: holder, token, heartbeat; created if missing",
    ),
    (
        ".NAME.leasehold-mutex",
        "a short flock mutex around every change of the lease, and the fencing-token high-water \
         mark; never renamed or deleted",
    ),
    (
        ".NAME.leasehold-queue/",
        "the wait queue: one ticket file per waiter, served in arrival order",
    ),
    (
        ".NAME.leasehold-seen-UID",
        "what user UID's processes have seen of a holder's heartbeat on another host",
    ),
    (
        ".NAME.leasehold-slot-K",
        "a shared or counted lock only (--shared, --slots N): the lease of one of its holders",
    ),
    (
        ".NAME.leasehold-tmp-RANDOM",
        "for a moment during each write: the new lease, renamed over LOCK",
    ),
];

/// leasehold(1).
fn man_leasehold(w: &mut dyn Write) -> io::Result<()> {
    let cmd = Cli::command();
    let man = Man::new(cmd.clone());
    let mut page = Page::default();
    man.render_title(&mut page.chunk())?;
    man.render_name_section(&mut page.chunk())?;
    man.render_synopsis_section(&mut page.chunk())?;
    let mut r = Roff::new();
    r.control("SH", ["DESCRIPTION"]);
    paragraph(
        &mut r,
        "leasehold run LOCK -- CMD runs CMD while holding a heartbeat lease on the file LOCK, \
         where you would use flock(1): crontabs, CI steps, deploy scripts. The lease names its \
         holder (pid, host, user, command), carries a fencing token that grows with every new \
         holder, and is renewed while CMD runs. A holder that dies is noticed at once on the \
         same host and after one TTL of silence from any other (so it works on NFS); a holder \
         that can no longer renew fences CMD (SIGTERM, grace, SIGKILL of its process group) \
         before anyone else may take over. LOCK may also name a lock on an etcd cluster \
         (etcd://HOSTS/NAME; see LOCK below).",
    );
    paragraph(
        &mut r,
        "Only when the lock is contended does run print one line saying who holds it, with \
         the --note of the holder, how long this host has seen its heartbeat unchanged, and \
         how long it has been held.",
    );
    r.control("SH", ["COMMANDS"]);
    page.push(r.render());
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        subcommand(&mut page, sub)?;
    }
    man.render_options_section(&mut page.chunk())?;
    let mut r = Roff::new();
    section(&mut r, "LOCK", LOCK_FORMS);
    section(&mut r, "DURATION", DURATION_HELP);
    section(&mut r, "EXIT STATUS", EXIT_CODES);
    r.control("SH", ["ENVIRONMENT"]);
    paragraph(
        &mut r,
        "The guarded command gets leasehold's environment plus:",
    );
    for (var, what) in ENVIRONMENT {
        r.control("TP", []).text([bold(*var)]).text([roman(*what)]);
    }
    r.control("SH", ["FILES"]);
    paragraph(
        &mut r,
        "Beside LOCK, in its directory (which leasehold needs write access to), for \
         LOCK = DIR/NAME:",
    );
    for (file, what) in FILES {
        r.control("TP", []).text([bold(*file)]).text([roman(*what)]);
    }
    r.control("SH", ["SEE ALSO"]);
    paragraph(&mut r, "flock(1), systemd.timer(5), crontab(5)");
    page.push(r.render());
    man.render_version_section(&mut page.chunk())?;
    w.write_all(page.text().as_bytes())
}

/// The DESCRIPTION of the `flock` page: what the front end keeps of flock(1), and what it adds.
const FLOCK_DESCRIPTION: [&str; 2] = [
    "Called as flock (ln -s leasehold /usr/local/bin/flock) or as leasehold flock, \
         leasehold accepts util-linux 2.41 flock(1)'s command line and behaves as it does: it \
         takes the same kernel lock on the named file (flock(2), or an open-file-description \
         lock), so unconverted flock(1) users, lslocks and udev see and respect it, and it is \
         silent unless asked to be verbose. The named file is never written, truncated, \
         renamed or chmodded; it may be the script itself, a directory or a device.",
    "By default that is all it does, exactly as flock(1): the command runs in the caller's \
         process group, what it leaves behind keeps running (and keeps the lock through the \
         inherited descriptor), nothing is ever killed, and no file is created but the named \
         one. Only with LEASEHOLD_FLOCK_FENCE=1 in the environment, for a lock around a \
         command it first takes a heartbeat lease (in the runtime directory; beside the file, \
         .NAME.leasehold-flock, on NFS; a shared one for a shared lock), then the kernel lock: waiters queue in order and are \
         told who holds the lock, leasehold status FILE and leasehold break FILE work on it, \
         the command gets LEASEHOLD_TOKEN, and a command whose lease is lost is stopped (exit \
         74). With --no-fork and in the file-descriptor form a detached keeper keeps the \
         lease: for the exec'd command, or for the shell that holds the descriptor until the \
         kernel lock is released (flock -u, the shell's exit, the last inheriting process's \
         exit). Where no lease can be kept (an unlock, a descriptor the calling process does \
         not hold, no write access to the directory, a read-only or full file system) it takes \
         the kernel lock only, exactly as flock(1) does, and says why when verbose.",
];

/// flock(1) as the `flock` name gives it: util-linux's command line, and what leasehold adds.
fn man_flock(w: &mut dyn Write) -> io::Result<()> {
    use crate::flock::args::{EXAMPLES, EXIT_STATUS, FORMS, OPTIONS};
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "FLOCK",
            "1",
            "",
            &format!("leasehold {}", env!("CARGO_PKG_VERSION")),
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman(
        "flock - manage locks from shell scripts (leasehold's flock(1)-compatible front end)",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    for f in FORMS {
        r.text([roman(f.replace("{prog}", "flock"))])
            .control("br", []);
    }
    r.control("SH", ["DESCRIPTION"]);
    for p in FLOCK_DESCRIPTION {
        paragraph(&mut r, p);
    }
    r.control("SH", ["OPTIONS"]);
    for (left, what) in OPTIONS.iter().chain(&[
        ("-h, --help", "display this help"),
        ("-V, --version", "display version"),
    ]) {
        r.control("TP", [])
            .text([bold(left.trim())])
            .text([roman(*what)]);
    }
    r.control("SH", ["EXIT STATUS"]);
    paragraph(&mut r, &format!("Exit status: {EXIT_STATUS}"));
    r.control("SH", ["EXAMPLES"]);
    for (example, what) in EXAMPLES {
        r.control("TP", [])
            .text([bold(*example)])
            .text([roman(*what)]);
    }
    r.control("SH", ["ENVIRONMENT"]);
    for (var, what) in [
        (
            "SHELL",
            "the shell that runs the command string of -c (/bin/sh when unset or empty)"
                .to_string(),
        ),
        (
            "LEASEHOLD_FLOCK_FENCE",
            "1: take a heartbeat lease as well (in the runtime directory; beside the file on \
             NFS), and stop (exit 74) a command whose lease is lost; unset or anything else: \
             flock(1) exactly"
                .to_string(),
        ),
        (
            "LEASEHOLD_FLOCK_TTL",
            format!(
                "the lease's time-to-live with LEASEHOLD_FLOCK_FENCE=1, a DURATION as \
                 leasehold(1) takes it (default {})",
                leasehold::DEFAULT_TTL_TEXT
            ),
        ),
    ] {
        r.control("TP", [])
            .text([bold(var)])
            .text([roman(what.as_str())]);
    }
    r.control("SH", ["FILES"]);
    r.control("TP", [])
        .text([bold(".NAME.leasehold-flock")])
        .text([roman(
            "with LEASEHOLD_FLOCK_FENCE=1 only, on NFS (or without a runtime directory), beside \
             the named file DIR/NAME: the lease, an ordinary leasehold LOCK with its own helper \
             files (see leasehold(1)); on a local file system the lease is \
             /run/lock/leasehold/flock-DEV-INO-BIRTH (root) or $XDG_RUNTIME_DIR/leasehold/flock-DEV-INO-BIRTH; \
             by default nothing is created but the named file",
        )]);
    r.control("SH", ["SEE ALSO"]);
    paragraph(
        &mut r,
        "flock(1) from util-linux, leasehold(1), flock(2), fcntl(2)",
    );
    w.write_all(r.render().as_bytes())
}

/// One subcommand: `.SS leasehold NAME`, its usage, what it does, its options, and its own
/// exit statuses and examples (its `--help` epilogue).
fn subcommand(page: &mut Page, sub: &clap::Command) -> io::Result<()> {
    let mut r = Roff::new();
    let name = format!("leasehold {}", sub.get_name());
    r.control("SS", [name.as_str()]);
    let usage = sub
        .clone()
        .bin_name(&name)
        .render_usage()
        .to_string()
        .replace("Usage: ", "");
    let usage: Vec<&str> = usage.lines().map(str::trim).collect();
    preformatted(&mut r, &usage.join("\n"));
    if let Some(about) = sub.get_about() {
        paragraph(&mut r, &about.to_string());
    }
    page.push(r.render());
    let mut opts = Vec::new();
    Man::new(sub.clone()).render_options_section(&mut opts)?;
    // Its options under this subcommand's heading rather than a top-level OPTIONS section.
    page.push(String::from_utf8_lossy(&opts).replace(".SH OPTIONS\n", ""));
    if let Some(after) = sub.get_after_help() {
        let mut r = Roff::new();
        // Back to the section's margin after the option list.
        r.control("PP", []);
        preformatted(&mut r, &after.to_string());
        page.push(r.render());
    }
    Ok(())
}

/// A `.SH` section holding `text` as it is laid out (tables of statuses, examples).
fn section(r: &mut Roff, title: &str, text: &str) {
    r.control("SH", [title]);
    preformatted(r, text);
}

/// `text` kept line for line (`.nf` … `.fi`), each line escaped by roff.
fn preformatted(r: &mut Roff, text: &str) {
    r.control("nf", []);
    for line in text.lines() {
        r.text([roman(line)]);
    }
    r.control("fi", []);
}

/// A filled paragraph.
fn paragraph(r: &mut Roff, text: &str) {
    r.control("PP", []).text([roman(text)]);
}

/// The page being assembled from roff chunks, each rendered with the roff crate's apostrophe
/// preamble: kept once, at the top.
#[derive(Default)]
struct Page {
    chunks: Vec<String>,
    pending: Vec<u8>,
}

impl Page {
    /// A writer for the next chunk (the previous pending one is kept first).
    fn chunk(&mut self) -> &mut Vec<u8> {
        self.flush();
        &mut self.pending
    }

    fn push(&mut self, s: String) {
        self.flush();
        self.chunks.push(s);
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            let s = String::from_utf8_lossy(&self.pending).into_owned();
            self.chunks.push(s);
            self.pending.clear();
        }
    }

    fn text(mut self) -> String {
        self.flush();
        let preamble = Roff::new().render();
        let mut out = preamble.clone();
        for c in &self.chunks {
            out.push_str(c.strip_prefix(preamble.as_str()).unwrap_or(c));
        }
        out
    }
}
