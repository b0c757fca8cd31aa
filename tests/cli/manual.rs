//! The documentation a user installs and reads, checked against the real binary:
//! - `--generate man` renders with `man -l` without a groff warning, and names every
//!   subcommand, every option of each (from the grammar itself), every exit status, the
//!   environment variables, the files kept beside LOCK, and DURATION.
//! - `--generate complete-bash`, sourced in bash, completes subcommands and options;
//!   `complete-zsh` and `complete-fish` name every subcommand.
//! - `leasehold --help` names every subcommand (`flock` too) and the etcd:// form; each
//!   subcommand's `--help` shows its own exit statuses (never `run`'s table elsewhere), what
//!   LOCK may be, examples, and (for `run`) what a DURATION is; the man page and the
//!   completions name every subcommand, and the `flock` page has EXAMPLES.
//! - The systemd recipe in `contrib/systemd/` passes `systemd-analyze verify` (with the man page
//!   its `Documentation=` names installed), and its `SuccessExitStatus` covers what
//!   `systemctl stop` makes leasehold exit with (KillMode=mixed: SIGTERM to leasehold, 143);
//!   every line of the README's systemd units is in those files.
//! - The user's guide (docs/guide.md) lists every file kept beside LOCK that the man page lists.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::CommandFactory;
use nix::sys::signal::Signal;

use crate::support::*;

/// The output of `leasehold --generate KIND`.
fn generated(kind: &str) -> String {
    let out = lh_assert().args(["--generate", kind]).assert().success();
    String::from_utf8(out.get_output().stdout.clone()).expect("utf-8")
}

/// Every long option of every subcommand, as `--name`, with the subcommand's name.
fn every_option() -> Vec<(String, String)> {
    let cmd = leasehold_cli::cli::args::Cli::command();
    let mut out = Vec::new();
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        for a in sub.get_arguments() {
            if let Some(l) = a.get_long() {
                out.push((sub.get_name().to_string(), format!("--{l}")));
            }
        }
    }
    out
}

/// `leasehold --generate KIND` (a manual page) rendered by `man -l`, which must succeed
/// without a groff warning.
#[track_caller]
fn rendered(kind: &str) -> String {
    let d = tempfile::tempdir().expect("tempdir");
    let page = d.path().join("page.1");
    std::fs::write(&page, generated(kind)).expect("write the page");
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(&page)
        .env("MANWIDTH", "250")
        .env("MANPAGER", "cat")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .expect("run man");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "man -l failed: {err}");
    assert!(err.trim().is_empty(), "groff warnings: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `--generate man-flock`: the page for the `flock` name renders with `man -l` without a groff
/// warning and names each of its three forms, every option of the front end's own list (both
/// spellings), every exit status, its environment and the lease file beside the named file.
#[test]
fn flock_man_page_renders_cleanly_and_covers_every_option() {
    if skip(!have("man"), "man is missing (Debian: man-db, groff-base)") {
        return;
    }
    let text = rendered("man-flock");
    let mut want: Vec<String> = leasehold_cli::flock::args::FORMS
        .iter()
        .map(|f| f.replace("{prog}", "flock"))
        .collect();
    for (left, _) in leasehold_cli::flock::args::OPTIONS {
        want.extend(
            left.split([',', ' '])
                .filter(|w| w.starts_with('-'))
                .map(String::from),
        );
    }
    want.extend(
        [
            "--help",
            "--version",
            "1 (or -E)",
            "64",
            "65",
            "66",
            "69",
            "71",
            "73",
            "74",
            "SHELL",
            "LEASEHOLD_FLOCK_TTL",
            ".NAME.leasehold-flock",
            "EXIT STATUS",
            "EXAMPLES",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    want.extend(
        leasehold_cli::flock::args::EXAMPLES
            .iter()
            .map(|(e, _)| e.to_string()),
    );
    assert!(want.iter().any(|w| w == "--fcntl") && want.iter().any(|w| w == "-E"));
    for w in want {
        assert!(
            text.contains(&w),
            "the rendered flock page lacks {w:?}:\n{text}"
        );
    }
}

#[test]
fn man_page_renders_cleanly_and_covers_everything() {
    if skip(!have("man"), "man is missing (Debian: man-db, groff-base)") {
        return;
    }
    let text = rendered("man");
    let mut want: Vec<String> = [
        "leasehold run",
        "leasehold lock",
        "leasehold unlock",
        "leasehold status",
        "leasehold break",
        "leasehold flock",
        "etcd://",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    want.extend(every_option().into_iter().map(|(_, o)| o));
    want.extend(
        [
            "128+N", "75", "74", "64", "65", "66", "70", "73", "77", "78", "126/127",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    want.extend(
        [
            "LEASEHOLD_LOCK",
            "LEASEHOLD_TOKEN",
            "LEASEHOLD_LEASE_ID",
            "DURATION",
            "EXIT STATUS",
            "ENVIRONMENT",
            "FILES",
            "--generate",
            "Examples:",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    want.extend(
        leasehold_cli::cli::generate::FILES
            .iter()
            .map(|(f, _)| f.to_string()),
    );
    for w in want {
        assert!(
            text.contains(&w),
            "the rendered man page lacks {w:?}:\n{text}"
        );
    }
}

/// Runs the bash completion function for the words typed so far (the last one being
/// completed) and returns the candidates.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let prog = format!(
        "source '{}' || exit 90\n\
         complete -p leasehold >/dev/null || exit 91\n\
         COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}\n\
         _leasehold leasehold '{}' '{}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &prog])
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "bash completion failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_completes_subcommands_and_options() {
    if skip(!have("bash"), "bash is missing") {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let script = d.path().join("leasehold.bash");
    std::fs::write(&script, generated("complete-bash")).expect("write the script");
    let subs = bash_complete(&script, &["leasehold", "st"]);
    assert_eq!(subs, ["status"], "completing `leasehold st`");
    let subs = bash_complete(&script, &["leasehold", "fl"]);
    assert_eq!(subs, ["flock"], "completing `leasehold fl`");
    let opts = bash_complete(&script, &["leasehold", "run", "--no"]);
    for o in ["--no-wait", "--note"] {
        assert!(
            opts.iter().any(|c| c == o),
            "`run --no` lacks {o}: {opts:?}"
        );
    }
    let top = bash_complete(&script, &["leasehold", "--gen"]);
    assert_eq!(top, ["--generate"], "completing `leasehold --gen`");
}

#[test]
fn zsh_and_fish_completions_name_every_subcommand_and_option() {
    // How each script offers a subcommand: zsh `'NAME:about'`, fish `-a "NAME"`.
    for (kind, marker, offered) in [
        ("complete-zsh", "#compdef leasehold", "'{}:"),
        ("complete-fish", "complete -c leasehold", "-a \"{}\""),
    ] {
        let text = generated(kind);
        assert!(text.contains(marker), "{kind} lacks {marker:?}");
        for w in ["run", "lock", "unlock", "status", "break", "flock"] {
            let offer = offered.replace("{}", w);
            assert!(
                text.contains(&offer),
                "{kind} lacks the subcommand {w} ({offer})"
            );
        }
        for (sub, o) in every_option() {
            let name = o.trim_start_matches("--");
            assert!(text.contains(name), "{kind} lacks {sub} {o}");
        }
    }
}

/// Each subcommand's `--help` (for `flock`, `leasehold help flock`: its own `--help` is
/// flock(1)'s) shows its own exit statuses — not `run`'s table, which only `run` has — what
/// LOCK may be (a file or etcd://), and examples; `leasehold --help` names every subcommand.
#[test]
fn each_subcommand_help_shows_its_exit_statuses_and_examples() {
    for (sub, codes) in [
        ("run", &["128+N", "75", "74", "64", "77", "126/127"][..]),
        ("lock", &["0 ", "75"][..]),
        ("unlock", &["0 ", "77", "75"][..]),
        ("status", &["0 ", "65", "66", "77"][..]),
        ("break", &["0 ", "75"][..]),
        ("flock", &["1 (or -E)", "74"][..]),
    ] {
        let args = if sub == "flock" {
            ["help", sub]
        } else {
            [sub, "--help"]
        };
        let out = lh_assert().args(args).assert().success();
        let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(text.contains("Exit status:"), "{sub} --help: {text}");
        for c in codes {
            assert!(text.contains(c), "{sub} --help lacks exit status {c}");
        }
        if sub != "run" {
            assert!(
                !text.contains("128+N"),
                "{sub} --help shows run's table:\n{text}"
            );
        }
        // `unlock` finds its keeper through LOCK's files: a file LOCK only.
        if !["flock", "unlock"].contains(&sub) {
            assert!(text.contains("etcd://"), "{sub} --help lacks etcd://");
        }
        let examples = text
            .split("Examples:")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.trim_start().starts_with("leasehold "))
            .count();
        assert!(
            examples >= 2,
            "{sub} --help shows {examples} examples:\n{text}"
        );
    }
    let out = lh_assert().arg("--help").assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for sub in ["run", "lock", "unlock", "status", "break", "flock"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(sub)),
            "--help does not list {sub}:\n{text}"
        );
    }
    assert!(text.contains("etcd://"), "--help lacks etcd://");
    let out = lh_assert().args(["run", "--help"]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for unit in ["DURATION is", "500ms", "1h30m", "1.5"] {
        assert!(
            text.contains(unit),
            "run --help does not explain DURATION ({unit})"
        );
    }
}

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The systemd units in `contrib/systemd/`.
const UNITS: [&str; 3] = [
    "leasehold-backup.service",
    "leasehold-backup.timer",
    "leasehold-etcd-report.service",
];

#[test]
fn systemd_recipe_passes_systemd_analyze_verify() {
    if skip(
        !have("systemd-analyze") || !have("man"),
        "systemd-analyze or man is missing (Debian: systemd, man-db)",
    ) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    // Documentation=man:leasehold(1) is checked: install the page where man finds it.
    let man1 = d.path().join("man/man1");
    std::fs::create_dir_all(&man1).expect("mkdir");
    std::fs::write(man1.join("leasehold.1"), generated("man")).expect("write the page");
    let mut units = Vec::new();
    for name in UNITS {
        let text = std::fs::read_to_string(root().join("contrib/systemd").join(name))
            .expect("read the unit");
        // ExecStart's program must exist: point it at the binary under test.
        let text = text.replace("/usr/local/bin/leasehold", &bin().display().to_string());
        let to = d.path().join(name);
        std::fs::write(&to, text).expect("write the unit");
        units.push(to);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("MANPATH", d.path().join("man"))
        .stdin(Stdio::null())
        .output()
        .expect("run systemd-analyze");
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A unit that runs /usr/local/bin/leasehold says how to install it there (the README's plain
/// `cargo install` puts it in ~/.cargo/bin), and the README's install names that way too.
#[test]
fn systemd_units_say_how_to_install_the_binary_they_name() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    assert!(
        readme.contains("--root /usr/local"),
        "README's install does not say how to put leasehold in /usr/local/bin"
    );
    let mut named = 0;
    for name in UNITS {
        let text = std::fs::read_to_string(root().join("contrib/systemd").join(name))
            .expect("read the unit");
        let Some(exec) = text.lines().find_map(|l| l.strip_prefix("ExecStart=")) else {
            continue;
        };
        let program = exec.split_whitespace().next().unwrap_or_default();
        assert_eq!(
            program, "/usr/local/bin/leasehold",
            "{name}: ExecStart={exec}"
        );
        named += 1;
        let install = if exec.contains("etcd://") {
            "cargo install --locked --root /usr/local --features etcd leasehold"
        } else {
            "cargo install --locked --root /usr/local leasehold"
        };
        assert!(
            text.contains(install),
            "{name} runs {program} but does not say how to install it there ({install})"
        );
    }
    assert_eq!(named, 2, "two units run leasehold");
}

/// What `systemctl stop` does to the unit (KillMode=mixed: SIGTERM to leasehold, which
/// forwards it to the job) makes leasehold exit with a status the recipe's `SuccessExitStatus`
/// lists, and the lease is released.
#[test]
fn systemctl_stop_exit_status_is_listed_as_success_in_the_recipe() {
    let unit = std::fs::read_to_string(root().join("contrib/systemd/leasehold-backup.service"))
        .expect("read the unit");
    let listed: Vec<i32> = unit
        .lines()
        .find_map(|l| l.strip_prefix("SuccessExitStatus="))
        .expect("SuccessExitStatus= in the unit")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let d = tempfile::tempdir().expect("tempdir");
    let lock = d.path().join("backup.lock");
    let mut h = Holder::start(&lock, &["-n", "--note", "systemd leasehold-backup.service"]);
    wait_for_child(&lock);
    assert!(
        unit.contains("KillMode=mixed"),
        "the recipe's KillMode changed"
    );
    // As systemd does with KillMode=mixed: SIGTERM to the main process only.
    h.kid.signal(Signal::SIGTERM);
    let st = h.kid.wait_timeout(Duration::from_secs(20));
    let code = code(st);
    assert_eq!(lease(&lock).expect("lease")["state"], "released");
    assert!(
        listed.contains(&code),
        "leasehold exited {code} on SIGTERM; SuccessExitStatus lists {listed:?}"
    );
    // And a skipped run (-n while the lock is held) is the other listed status.
    assert!(
        listed.contains(&75),
        "SuccessExitStatus lacks 75: {listed:?}"
    );
}

/// The user's guide lists every file kept beside LOCK that the man page lists (update the table
/// in docs/guide.md, "Files kept beside LOCK", with `cli::generate::FILES`), and the README says
/// how to install the binary, its manual page and completions.
#[test]
fn guide_lists_every_file_kept_beside_lock_and_readme_how_to_install() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let guide = std::fs::read_to_string(root().join("docs/guide.md")).expect("docs/guide.md");
    assert!(
        readme.contains("docs/guide.md#files-kept-beside-lock"),
        "README does not link to the list of files kept beside LOCK"
    );
    for (f, _) in leasehold_cli::cli::generate::FILES {
        let in_guide = f.replace("NAME", "LOCK");
        assert!(
            guide.contains(&format!("| `{in_guide}` |")),
            "docs/guide.md's table of files kept beside LOCK does not list {in_guide}"
        );
    }
    for needle in [
        "cargo install --locked",
        "--generate man",
        "--generate complete-bash",
        "contrib/systemd/",
    ] {
        assert!(readme.contains(needle), "README lacks {needle:?}");
    }
}

/// Every line of the `ini` blocks (the systemd recipe) of the README (the service's core) and of
/// docs/guide.md (the service and its timer) is a line of the units in `contrib/systemd/`, which
/// `systemd_recipe_passes_systemd_analyze_verify` checks.
#[test]
fn readme_systemd_recipe_is_the_verified_units() {
    let mut units = String::new();
    for name in UNITS {
        units += &std::fs::read_to_string(root().join("contrib/systemd").join(name))
            .expect("read the unit");
    }
    let unit_lines: Vec<&str> = units.lines().map(str::trim).collect();
    for (doc, least) in [("README.md", 1), ("docs/guide.md", 2)] {
        let text = std::fs::read_to_string(root().join(doc)).expect("read the document");
        let mut blocks = 0;
        for block in text.split("```ini\n").skip(1) {
            blocks += 1;
            let block = block.split("```").next().unwrap_or_default();
            for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
                assert!(
                    unit_lines.contains(&line),
                    "{doc}'s systemd line {line:?} is not in contrib/systemd/"
                );
            }
        }
        assert!(blocks >= least, "{doc} shows {blocks} systemd units");
    }
}
