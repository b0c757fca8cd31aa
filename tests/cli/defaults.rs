//! One home per default: the default TTL and the heartbeat, grace and margin rules live in
//! `lib/src/timing.rs` (`leasehold::DEFAULT_TTL`, `HEARTBEAT_DIVISOR`, `GRACE_DIVISOR`,
//! `GRACE_CAP`, `MARGIN_DIVISOR`, `MARGIN_FLOOR`); `--help` and the manual page are built from
//! them. The documents that state them in prose are checked here: when this fails after a
//! change of a default, update the named document's sentence (or the model's constants) to say
//! what `lib/src/timing.rs` now says.

use std::path::Path;

/// The documents that state a default or a rule, and how many statements each must hold (so that
/// a reworded sentence that no longer matches is noticed rather than silently unchecked).
const DOCS: &[(&str, usize)] = &[
    ("docs/PROTOCOL.md", 3),
    ("docs/flock.md", 1),
    ("docs/guide.md", 1),
    ("docs/benchmarks.md", 1),
    ("model/README.md", 2),
    ("model/leasehold.pml", 1),
    ("lib/src/builder.rs", 2),
    ("README.md", 3),
];

/// `text` without white space, so that a rule wrapped across lines (`min(5 s,\n TTL/4)`) reads
/// as one (`min(5s,TTL/4)`).
fn squash(text: &str) -> String {
    text.split_whitespace().collect()
}

/// The statements of a rule in `text` (squashed): each `min(…TTL/…)` and `max(…TTL/…)`, and each
/// `TTL/N` that follows a mention of the heartbeat. Returns (what was found, what it should be).
fn rule_statements(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (open, rule) in [
        ("min(", leasehold::grace_rule()),
        ("max(", leasehold::margin_rule()),
    ] {
        for (i, _) in text.match_indices(open) {
            let Some(len) = text[i..].find(')') else {
                continue;
            };
            let stated = &text[i..=i + len];
            if stated.contains("TTL/") && !stated[open.len()..].contains('(') {
                found.push((stated.to_string(), squash(&rule)));
            }
        }
    }
    for (i, _) in text.match_indices("TTL/") {
        let before = text[..i].chars().rev().take(50).collect::<String>();
        let before: String = before.chars().rev().collect();
        if !before.to_lowercase().contains("heartbeat") || before.ends_with("min(") {
            continue;
        }
        let digits: String = text[i + 4..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        found.push((format!("TTL/{digits}"), leasehold::heartbeat_rule()));
    }
    found
}

/// The default TTL as `text` (not squashed) states it: each `default` followed, within a few
/// words, by a duration such as `30s`, `30 s`, `` `30s` `` or `TTL 30 s`.
fn ttl_statements(text: &str) -> Vec<String> {
    let flat = text.replace('\n', " ");
    let mut found = Vec::new();
    for (i, _) in flat.to_lowercase().match_indices("default") {
        let window: String = flat[i + "default".len()..].chars().take(25).collect();
        if window.contains("min(") || window.contains("max(") {
            continue;
        }
        let rest = window.trim_start_matches(|c: char| " :`TL".contains(c));
        let num: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if num.is_empty() {
            continue;
        }
        let unit: String = rest[num.len()..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect();
        if ["ms", "s", "m", "h"].contains(&unit.as_str()) {
            found.push(format!("{num}{unit}"));
        }
    }
    found
}

#[test]
fn documents_state_the_defaults_the_code_uses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (doc, at_least) in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).expect("read the document");
        let rules = rule_statements(&squash(&text));
        let ttls = ttl_statements(&text);
        for (stated, code) in &rules {
            assert_eq!(
                stated, code,
                "{doc} states {stated} but lib/src/timing.rs's rule is {code}: update {doc}"
            );
        }
        for stated in &ttls {
            assert_eq!(
                stated,
                leasehold::DEFAULT_TTL_TEXT,
                "{doc} states a default TTL of {stated} but leasehold::DEFAULT_TTL is {}: update \
                 {doc}",
                leasehold::DEFAULT_TTL_TEXT
            );
        }
        assert!(
            rules.len() + ttls.len() >= *at_least,
            "{doc} states {} defaults where {at_least} were found before ({rules:?} {ttls:?}): \
             a sentence was reworded out of this test's sight — make it state the default as \
             `TTL/N`, `min(…)`, `max(…)` or `default 30s`, or lower the count in \
             tests/cli/defaults.rs",
            rules.len() + ttls.len()
        );
    }
}

/// The checks above find what they look for: a wrong rule or TTL in a sentence is reported.
#[test]
fn a_stale_statement_of_a_default_is_found() {
    let stale = squash("renewed every heartbeat interval (default TTL/2), grace min(5 s, TTL/3)");
    let rules = rule_statements(&stale);
    assert!(
        rules.iter().any(|(s, c)| s == "min(5s,TTL/3)" && c != s),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|(s, c)| s == "TTL/2" && c != s),
        "{rules:?}"
    );
    assert_eq!(
        ttl_statements("the lease's TTL (default `45s`); default TTL 30 s"),
        ["45s", "30s"]
    );
}

/// The model's constants keep the code's heartbeat rule: HB = TTL / HEARTBEAT_DIVISOR ticks.
#[test]
fn model_heartbeat_is_the_codes_rule() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pml = std::fs::read_to_string(root.join("model/leasehold.pml")).expect("read the model");
    let define = |name: &str| -> u32 {
        pml.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("#define") && w.next() == Some(name))
                    .then(|| w.next().and_then(|v| v.parse().ok()))
                    .flatten()
            })
            .unwrap_or_else(|| panic!("model/leasehold.pml has no #define {name} N"))
    };
    assert_eq!(
        define("HB") * leasehold::HEARTBEAT_DIVISOR,
        define("TTL"),
        "model/leasehold.pml's HB is not TTL/{}: update the model (and model/README.md)",
        leasehold::HEARTBEAT_DIVISOR
    );
}
