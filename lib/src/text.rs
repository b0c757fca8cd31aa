//! Showing untrusted text on a terminal: lease fields, paths and command lines.
//!
//! Owns: the display escaper ([`escape`], [`escape_os`]), the control-only line pass
//! ([`scrub`]) and the shell-quoting of argv for display ([`quote_argv`]). Must never: change
//! what is stored in a lease or printed as JSON (serde escapes by construction), or let a
//! control character, C1 control or bidi/line-separator control through to its output.
//!
//! Escaping rules ([`escape`]), chosen so that the output is unambiguous (the mapping is
//! injective: every escape starts with a backslash, and a literal backslash is itself escaped):
//!
//! | input | shown as |
//! |---|---|
//! | `\` | `\\` |
//! | LF, CR, TAB | `\n`, `\r`, `\t` |
//! | other C0 controls (U+0000–U+001F) and DEL (U+007F) | `\xNN` (two lowercase hex digits) |
//! | a byte that is not part of valid UTF-8 (paths only) | `\xNN` (NN ≥ 80) |
//! | C1 controls (U+0080–U+009F) | `\u{NN}` |
//! | bidi controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), U+2028, U+2029 | `\u{NNNN}` |
//! | anything else | itself |
//!
//! Command lines ([`quote_argv`]) read as typed in a POSIX shell: plain words unquoted, other
//! words in single quotes (`'a; b'`, with `'` written `'\''`), and words holding any character
//! the escaper would escape in bash's ANSI-C form `$'…'` (`\\`, `\'`, `\n`, `\r`, `\t`, `\xNN`
//! for other C0 controls, DEL and invalid UTF-8 bytes, `\uNNNN` for C1 and bidi controls), so
//! that pasting the line into bash, zsh or ksh93 runs exactly the recorded argv. The quoter's
//! output contains no control characters, so it is already safe to show.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::Path;

/// Whether `c` must never reach a terminal raw.
fn is_unsafe(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200e}' | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}'
        | '\u{2028}' | '\u{2029}')
}

/// Appends the escaped form of one unsafe character (see the module table).
fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{0}'..='\u{1f}' | '\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        }
        _ => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
}

/// `s` made safe and unambiguous to show: controls, DEL, C1 and bidi controls escaped, and
/// backslashes doubled. Borrows when nothing needed escaping.
///
/// ```
/// use leasehold::text::escape;
/// assert_eq!(escape("nightly"), "nightly");
/// assert_eq!(escape("a\u{1b}]0;x\u{7}\nb"), "a\\x1b]0;x\\x07\\nb");
/// assert_eq!(escape("a\\x1b"), "a\\\\x1b"); // a literal backslash is told apart
/// assert_eq!(escape("\u{202e}txt"), "\\u{202e}txt");
/// ```
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_with(s, true)
}

/// Like [`escape`] but leaves backslashes alone: for a whole line some of whose parts were
/// already escaped (or shell-quoted) and must not be escaped twice. The result holds no
/// character [`escape`] would escape other than `\`, so it is safe to show, and it is
/// idempotent: scrubbing a scrubbed or escaped text changes nothing.
///
/// ```
/// use leasehold::text::scrub;
/// assert_eq!(scrub("held by a@b pid 1 ($'\\x1b')"), "held by a@b pid 1 ($'\\x1b')");
/// assert_eq!(scrub("x\r\nleasehold: forged"), "x\\r\\nleasehold: forged");
/// ```
pub fn scrub(s: &str) -> Cow<'_, str> {
    escape_with(s, false)
}

fn escape_with(s: &str, backslash: bool) -> Cow<'_, str> {
    let needs = |c: char| is_unsafe(c) || (backslash && c == '\\');
    let Some(first) = s.find(needs) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if c == '\\' && backslash {
            out.push_str("\\\\");
        } else if is_unsafe(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`escape`] for an OS string (a path, an argument): bytes that are not valid UTF-8 are shown
/// as `\xNN`.
///
/// ```
/// use std::os::unix::ffi::OsStrExt;
/// use leasehold::text::escape_os;
/// let p = std::ffi::OsStr::from_bytes(b"/tmp/\x1b[2J\xff.lock");
/// assert_eq!(escape_os(p), "/tmp/\\x1b[2J\\xff.lock");
/// ```
pub fn escape_os(s: &OsStr) -> Cow<'_, str> {
    let bytes = s.as_encoded_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        return escape(s);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&escape(chunk.valid()));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// [`escape_os`] for a path.
pub fn escape_path(p: &Path) -> Cow<'_, str> {
    escape_os(p.as_os_str())
}

/// Characters that need no quoting anywhere in a word.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-./:@%+,".contains(&b)
}

/// Appends one word of a command line, quoted as needed (see the module documentation).
/// `first` words containing `=` are quoted so that they do not read as an assignment.
fn push_word(out: &mut String, word: &[u8], first: bool) {
    if !word.is_empty() && word.iter().all(|&b| is_plain(b) || (b == b'=' && !first)) {
        // All ASCII, so this is valid UTF-8.
        out.push_str(&String::from_utf8_lossy(word));
        return;
    }
    let ansi_c = match std::str::from_utf8(word) {
        Ok(s) => s.chars().any(is_unsafe),
        Err(_) => true,
    };
    if !ansi_c {
        out.push('\'');
        // Valid UTF-8 (checked above).
        out.push_str(&String::from_utf8_lossy(word).replace('\'', "'\\''"));
        out.push('\'');
        return;
    }
    out.push_str("$'");
    for chunk in word.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{0}'..='\u{1f}' | '\u{7f}' => {
                    let _ = write!(out, "\\x{:02x}", u32::from(c));
                }
                c if is_unsafe(c) => {
                    let _ = write!(out, "\\u{:04x}", u32::from(c));
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('\'');
}

/// A command line as a person would type it into a POSIX shell: `sh -c 'a; b'`,
/// `echo 'it'\''s'`, `printf $'\x1b[2J'`. Safe to show as is.
///
/// ```
/// use leasehold::text::quote_argv;
/// assert_eq!(quote_argv(&["sh", "-c", "a; b"]), "sh -c 'a; b'");
/// assert_eq!(quote_argv(&["echo", "it's"]), r"echo 'it'\''s'");
/// assert_eq!(quote_argv(&["printf", "\u{1b}[2J\n"]), r"printf $'\x1b[2J\n'");
/// ```
pub fn quote_argv<S: AsRef<OsStr>>(argv: &[S]) -> String {
    let mut out = String::new();
    for (i, w) in argv.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        push_word(&mut out, w.as_ref().as_encoded_bytes(), i == 0);
    }
    out
}

/// `bytes` as one POSIX shell word that `eval` turns back into exactly these bytes: in single
/// quotes, each `'` written as `'\''`. Unlike [`quote_argv`] (for people), nothing is escaped:
/// a newline stays a newline. For machine-read output only (`leasehold lock`'s exports), never
/// for a terminal.
///
/// ```
/// assert_eq!(leasehold::text::sh_word(b"it's"), b"'it'\\''s'".to_vec());
/// ```
pub fn sh_word(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 2);
    out.push(b'\'');
    for &b in bytes {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// No byte below 0x20, no DEL, no C1 and no bidi control.
    fn terminal_safe(s: &str) -> bool {
        !s.chars().any(is_unsafe)
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in [
            "",
            "nightly backup",
            "alice@web1",
            "café ünïcode ✓",
            "a/b.lock",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(b) if b == s), "{s:?}");
            assert!(matches!(scrub(s), Cow::Borrowed(b) if b == s), "{s:?}");
        }
    }

    #[test]
    fn every_c0_control_del_and_c1_is_escaped() {
        for c in (0u32..0x20).chain(0x7f..0xa0).filter_map(char::from_u32) {
            let s = format!("a{c}b");
            let e = escape(&s);
            assert!(terminal_safe(&e), "{c:?} -> {e:?}");
            assert!(e.starts_with("a\\") && e.ends_with('b'), "{c:?} -> {e:?}");
        }
        assert_eq!(escape("\n\r\t"), "\\n\\r\\t");
        assert_eq!(escape("\u{0}\u{7}\u{1b}\u{7f}"), "\\x00\\x07\\x1b\\x7f");
        assert_eq!(escape("\u{85}\u{9b}"), "\\u{85}\\u{9b}");
    }

    #[test]
    fn bidi_and_line_separators_are_escaped() {
        let all = "\u{61c}\u{200e}\u{200f}\u{202a}\u{202b}\u{202c}\u{202d}\u{202e}\
                   \u{2066}\u{2067}\u{2068}\u{2069}\u{2028}\u{2029}";
        let e = escape(all);
        assert!(terminal_safe(&e), "{e:?}");
        assert_eq!(e.matches("\\u{").count(), all.chars().count());
        assert_eq!(escape("x\u{202e}y"), "x\\u{202e}y");
    }

    #[test]
    fn a_literal_backslash_sequence_differs_from_an_escaped_control() {
        assert_ne!(escape("\\x1b"), escape("\u{1b}"));
        assert_ne!(escape("\\n"), escape("\n"));
        assert_eq!(escape("\\x1b"), "\\\\x1b");
        // Injective over a small alphabet: all strings of length <= 3 map to distinct outputs.
        let alphabet = [
            '\\', 'x', '1', 'b', 'n', '\u{1b}', '\n', '\u{202e}', 'u', '{',
        ];
        let mut seen = std::collections::HashMap::new();
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    let s: String = [a, b, c].iter().collect();
                    if let Some(prev) = seen.insert(escape(&s).into_owned(), s.clone()) {
                        panic!("{prev:?} and {s:?} escape alike");
                    }
                }
            }
        }
    }

    #[test]
    fn scrub_keeps_backslashes_and_is_idempotent() {
        let raw = "a\\b\u{1b}[2J\r\nleasehold: forged\u{202e}";
        let once = scrub(raw);
        assert_eq!(once, "a\\b\\x1b[2J\\r\\nleasehold: forged\\u{202e}");
        assert_eq!(scrub(&once), once);
        let escaped = escape(raw);
        assert_eq!(scrub(&escaped), escaped);
    }

    #[test]
    fn invalid_utf8_bytes_show_as_hex() {
        let p = OsStr::from_bytes(b"/tmp/a\xffb\x1b.lock");
        assert_eq!(escape_os(p), "/tmp/a\\xffb\\x1b.lock");
        assert!(matches!(
            escape_os(OsStr::new("/tmp/x")),
            Cow::Borrowed("/tmp/x")
        ));
    }

    #[test]
    fn commands_read_as_typed() {
        assert_eq!(quote_argv(&["sh", "-c", "a; b"]), "sh -c 'a; b'");
        assert_eq!(quote_argv(&["echo", "it's"]), "echo 'it'\\''s'");
        assert_eq!(quote_argv(&["terraform", "apply"]), "terraform apply");
        assert_eq!(quote_argv(&["ls", ""]), "ls ''");
        assert_eq!(quote_argv(&["env", "A=b", "x y"]), "env A=b 'x y'");
        assert_eq!(quote_argv(&["A=b", "x"]), "'A=b' x");
        assert_eq!(
            quote_argv(&["echo", "~", "#x", "$HOME", "a*"]),
            "echo '~' '#x' '$HOME' 'a*'"
        );
        assert_eq!(quote_argv(&["printf", "a\\n"]), "printf 'a\\n'");
        assert_eq!(quote_argv::<&str>(&[]), "");
    }

    #[test]
    fn control_characters_in_words_use_ansi_c_quoting() {
        assert_eq!(
            quote_argv(&["printf", "\u{1b}]0;pwned\u{7}"]),
            "printf $'\\x1b]0;pwned\\x07'"
        );
        assert_eq!(quote_argv(&["echo", "it's\n\\x"]), "echo $'it\\'s\\n\\\\x'");
        assert_eq!(quote_argv(&["x\u{202e}y"]), "$'x\\u202ey'");
        assert_eq!(quote_argv(&["\u{85}"]), "$'\\u0085'");
        let bad = OsStr::from_bytes(b"a\xff\x01");
        assert_eq!(quote_argv(&[bad]), "$'a\\xff\\x01'");
        for w in [
            "\u{1b}[2J",
            "\r\nleasehold: forged",
            "\u{2066}x",
            "a\u{9b}31m",
        ] {
            let q = quote_argv(&["cmd", w]);
            assert!(terminal_safe(&q), "{w:?} -> {q:?}");
        }
    }

    #[test]
    fn quoted_words_stay_distinct() {
        assert_ne!(quote_argv(&["a b"]), quote_argv(&["a", "b"]));
        assert_ne!(quote_argv(&["\\x1b"]), quote_argv(&["\u{1b}"]));
    }
}
