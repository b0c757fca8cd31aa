//! The README tells the truth: its quick start is exactly the two documented commands and the
//! demo command works; its library example is this file's `example` module, which compiles and
//! runs; the test command is `cargo test --release`.

use crate::support::*;

const README: &str = include_str!("../../README.md");
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
    let readme = between(README, "```rust\n", "```");
    // rustfmt may wrap the indented copy differently: compare without white space.
    let squash = |t: &str| t.split_whitespace().collect::<String>();
    assert_eq!(
        squash(readme),
        squash(&ours),
        "README:\n{readme}\ncompiled:\n{ours}"
    );
    example::main().expect("the README's library example runs");
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
