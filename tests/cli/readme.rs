//! The README tells the truth: its quick start is exactly the two documented commands and the
//! demo command works; the test command is `cargo test --release`; its `run` options and exit
//! statuses are `leasehold run --help`'s; the library example (docs/library.md) is this file's
//! `example` module, which compiles and runs; the links of the README and docs/ resolve, and
//! every document in docs/ is reachable from the README.
//!
//! When one of these fails after a change to the command line, update README.md (the blocks can
//! be rewritten from `--help` with `LEASEHOLD_BLESS_README=1 cargo test --release --test cli
//! readme::`; review the diff) or docs/library.md together with `example` below.

use crate::support::*;

const README: &str = include_str!("../../README.md");
const LIBRARY: &str = include_str!("../../docs/library.md");
const THIS: &str = include_str!("readme.rs");

mod example {
    // README-EXAMPLE-BEGIN
    use std::time::Duration;

    pub fn main() -> Result<(), leasehold::Error> {
        let lock = std::env::temp_dir().join("backup.lock");

        let guard = leasehold::LeaseBuilder::new(&lock)
            .ttl(Duration::from_secs(30))
            .try_acquire()?;

        // A second contender is refused while the first holds it, and told who holds it.
        let err = leasehold::LeaseBuilder::new(&lock)
            .try_acquire()
            .unwrap_err();
        assert!(matches!(err, leasehold::Error::WouldBlock { .. }));

        let token = guard.token(); // hand this to the resource you guard
        guard.release_with("exit 0")?;

        // The next holder gets a greater token.
        let next = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
        assert!(next.token() > token);
        Ok(())
    }
    // README-EXAMPLE-END
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let s = text.find(start).expect("start marker") + start.len();
    let e = s + text[s..].find(end).expect("end marker");
    &text[s..e]
}

#[test]
fn readme_library_example_is_this_compiled_one() {
    let ours: String = between(
        THIS,
        "// README-EXAMPLE-BEGIN\n",
        "    // README-EXAMPLE-END",
    )
    .lines()
    .map(|l| l.strip_prefix("    ").unwrap_or(l).to_string() + "\n")
    .collect::<String>()
    .replace("pub fn main", "fn main");
    let readme = between(LIBRARY, "```rust\n", "```");
    // rustfmt may wrap the indented copy differently: compare without white space.
    let squash = |t: &str| t.split_whitespace().collect::<String>();
    assert_eq!(
        squash(readme),
        squash(&ours),
        "docs/library.md's example differs from tests/cli/readme.rs's `example` module: change both \
         together\ndocs/library.md:\n{readme}\ncompiled:\n{ours}"
    );
    example::main().expect("the library example of docs/library.md runs");
}

#[test]
fn readme_quick_start_is_two_commands_that_work() {
    let qs = between(README, "## Quick start", "\n## ");
    let block = between(qs, "```sh\n", "```");
    let cmds: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(cmds.len(), 2, "{block}");
    assert_eq!(cmds[1], "cargo test --release");
    let demo = cmds[0]
        .strip_prefix("cargo run --release -- ")
        .expect("the demo runs the binary through cargo");
    // Run the same command line against the built binary.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec \"$0\" {demo}"))
        .arg(bin())
        .output()
        .expect("run the demo");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("holding /tmp/demo.lock with token "),
        "{text}"
    );
}

/// The README's marked blocks, each with the section of `leasehold run --help` it copies.
const HELP_BLOCKS: [(&str, &str); 2] = [
    (
        "<!-- run --help: options (checked by tests/cli/readme.rs) -->",
        "Options:\n",
    ),
    (
        "<!-- run --help: exit statuses (checked by tests/cli/readme.rs) -->",
        "Exit status:\n",
    ),
];

/// The body of the code block that follows `marker` in `text`, as a byte range.
fn block_after(text: &str, marker: &str) -> std::ops::Range<usize> {
    let m = text
        .find(marker)
        .unwrap_or_else(|| panic!("README.md has no {marker:?} marker"));
    let fence = m + text[m..]
        .find("```")
        .expect("a code block after the marker");
    let start = fence + text[fence..].find('\n').expect("the fence's line") + 1;
    let end = start + text[start..].find("```").expect("the block's end");
    start..end
}

/// The lines of `help` after the line `title`, up to the next blank line.
fn help_section<'a>(help: &'a str, title: &str) -> &'a str {
    let s = help
        .find(title)
        .unwrap_or_else(|| panic!("`run --help` has no {title:?}"))
        + title.len();
    let e = help[s..].find("\n\n").map_or(help.len(), |e| s + e);
    &help[s..e]
}

/// `line` wrapped at 100 columns, continuation lines indented to where its text starts (the
/// option's description, or an exit status's meaning).
fn wrap(line: &str) -> String {
    const WIDTH: usize = 100;
    if line.chars().count() <= WIDTH {
        return line.to_string();
    }
    let lead = line.len() - line.trim_start().len();
    let indent = line[lead..]
        .find("  ")
        .map(|i| lead + i + line[lead + i..].len() - line[lead + i..].trim_start().len())
        .unwrap_or(lead);
    let mut out = String::new();
    let mut cur = line[..indent].to_string();
    for word in line[indent..].split(' ') {
        if cur.len() > indent && cur.len() + 1 + word.len() > WIDTH {
            out += cur.trim_end();
            out.push('\n');
            cur = " ".repeat(indent);
        } else if cur.len() > indent {
            cur.push(' ');
        }
        cur += word;
    }
    out + cur.trim_end()
}

/// The README's `run` options and exit statuses are those `leasehold run -h` prints (the short
/// help, one line per option, which `--help` expands once any option has a long text) (line
/// breaks aside: the README wraps long lines at 100 columns), so a flag or status added, removed
/// or reworded in `src/cli/args.rs` fails here until README.md shows it.
#[test]
fn readme_run_options_and_exit_statuses_are_run_help() {
    let out = std::process::Command::new(bin())
        .args(["run", "-h"])
        .output()
        .expect("run `leasehold run -h`");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let mut readme = std::fs::read_to_string(&path).expect("read README.md");
    let bless = std::env::var_os("LEASEHOLD_BLESS_README").is_some();
    let squash = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    for (marker, title) in HELP_BLOCKS {
        let section = help_section(&help, title);
        // A comparison of two empty texts would check nothing.
        assert!(
            section.lines().count() >= 5,
            "`run --help`'s {title:?}: {section}"
        );
        let range = block_after(&readme, marker);
        if bless {
            let body: String = section.lines().map(|l| wrap(l) + "\n").collect();
            readme.replace_range(range, &body);
            continue;
        }
        assert_eq!(
            squash(&readme[range]),
            squash(section),
            "README.md's block after {marker:?} is not `leasehold run --help`'s {title:?}: update \
             README.md (LEASEHOLD_BLESS_README=1 cargo test --release --test cli readme:: \
             rewrites it from --help; review the diff)"
        );
    }
    if bless {
        std::fs::write(&path, readme).expect("write README.md");
    }
}

/// Documents that other work in progress adds; linked from the README ahead of their arrival.
/// Remove a name here once its file is in `docs/`.
const COMING: &[&str] = &[];

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut v = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            v.push(slug(line.trim_start_matches('#')));
        }
    }
    v
}

/// Every relative link of the README and of `docs/*.md` leads to a file that exists and, with a
/// `#fragment`, to a heading there; every document in `docs/` is linked from the README (what
/// was moved out of it stays reachable). On failure, fix the link or the heading it names.
#[test]
fn readme_and_docs_links_resolve_and_every_doc_is_reachable_from_the_readme() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs.iter().cloned());
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a document");
        for link in text.split("](").skip(1) {
            let Some(target) = link.split(')').next() else {
                continue;
            };
            if target.contains("://") || target.contains(' ') || target.starts_with("mailto:") {
                continue;
            }
            let (path, frag) = target.split_once('#').unwrap_or((target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a directory").join(path)
            };
            let shown = dest
                .strip_prefix(root)
                .unwrap_or(&dest)
                .display()
                .to_string();
            let shown = shown.replace("docs/../", "");
            if !dest.exists() && COMING.contains(&shown.as_str()) {
                continue;
            }
            assert!(
                dest.exists(),
                "{}: link to {target}: no such file",
                file.display()
            );
            if !frag.is_empty() && dest.extension().is_some_and(|x| x == "md") {
                let there = std::fs::read_to_string(&dest).expect("read the link's target");
                assert!(
                    anchors(&there).iter().any(|a| a == frag),
                    "{}: link to {target}: no such heading in {shown}",
                    file.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links checked");
    for doc in &docs {
        let name = doc
            .strip_prefix(root)
            .expect("under the root")
            .display()
            .to_string();
        assert!(
            README.contains(&format!("]({name}")),
            "README.md does not link to {name}: add it to the contents"
        );
    }
}
