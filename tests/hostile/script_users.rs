//! Script mode among several users: a script-mode lease of one user cannot be unlocked by
//! another user, nor by root from outside the script (both refused, exit 77, the lease kept);
//! the script's own unlock still works afterwards.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::harness::{self, Who, World};
use crate::support::Proc;
use crate::support::wait::ensure_within;

const LONG: Duration = Duration::from_secs(40);

/// User A's script holds LOCK in a group-shared directory; user B's `leasehold unlock` and
/// root's (not started by the script) are refused with a line naming `break`, the lease stays
/// held; A's script then unlocks it itself.
#[test]
fn another_users_unlock_of_a_script_lease_is_refused() {
    if harness::skip("another_users_unlock_of_a_script_lease_is_refused") {
        return;
    }
    let w = World::new();
    let dir = w.dir("script", 0o2775, Who::Root);
    let lock = dir.join("job.lock");
    let go = dir.join("go");
    let body = r#"out=$("$3" lock -n --ttl 30s "$1") || exit $?
eval "$out"
while [ ! -e "$2" ]; do sleep 0.02; done
"$3" unlock "$1"; echo "unlock $?""#;
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (l, g, b) = (s(&lock), s(&go), s(&w.bin));
    let mut script = Proc::spawn_collecting(
        w.cmd(
            Who::User(&w.a),
            0o002,
            Path::new("sh"),
            &["-c", body, "sh", &l, &g, &b],
        ),
        "A's script",
    );
    let held = || {
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&lock).unwrap_or_default()).unwrap_or_default();
        v["state"] == "held" && v["holder"]["on_behalf"] == true
    };
    ensure_within("A's script to hold the lock", LONG, held);
    for who in [Who::User(&w.b), Who::Root] {
        let o = w.run(who, 0o022, &["unlock", &l], LONG);
        assert_eq!(o.code, 77, "{} unlock: {}", who.name(), o.stderr);
        assert!(
            o.stderr.contains("refused") && o.stderr.contains("break"),
            "{}: {}",
            who.name(),
            o.stderr
        );
        assert!(held(), "still held after {}'s unlock", who.name());
    }
    fs::write(&go, "").unwrap();
    let o = script.finish(LONG);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("unlock 0"), "{}", o.stdout);
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
    assert_eq!(v["state"], "released");
}
