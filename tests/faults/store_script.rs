//! Script mode on a networked store (etcd, S3), the same scenario on each: `etcd::` and `s3::`
//! call it with their store's URL and environment.

use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{Proc, bin, code, ensure_within, lh};

/// `eval "$(leasehold lock URL)"` holds the lease for a script. `leasehold unlock URL` from a
/// process that is neither the script nor started by it is refused (77) and the lease stays
/// held; from the script it releases (0: the keeper, verified by its badge in the runtime
/// directory, was signalled and let go), and the lock is free again at once. `apply` gives a
/// command the store's environment.
pub fn unlock_from_the_script_only(url: &str, apply: &dyn Fn(&mut Command)) {
    let tmp = tempfile::tempdir().unwrap();
    let (locked, go) = (tmp.path().join("locked"), tmp.path().join("go"));
    let body = r#"out=$("$LH" lock -n --ttl 30s "$1") || exit $?
eval "$out"
touch "$2"
while [ ! -e "$3" ]; do sleep 0.02; done
"$LH" unlock "$1"; echo "unlock $?"
"$LH" run -n "$1" -- true; echo "after $?""#;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(body)
        .arg("sh")
        .arg(url)
        .arg(&locked)
        .arg(&go)
        .env("LH", bin())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    apply(&mut c);
    let mut s = Proc::spawn(c, "the script");
    ensure_within(
        "the script to hold the lock",
        Duration::from_secs(20),
        || locked.exists(),
    );
    let leasehold = |args: &[&str]| {
        let mut c = lh();
        apply(&mut c);
        let o = c.args(args).output().expect("run leasehold");
        (
            code(o.status),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (rc, _, err) = leasehold(&["unlock", url]);
    assert_eq!(rc, 77, "a stranger's unlock is refused: {err}");
    let (rc, json, err) = leasehold(&["status", "--json", url]);
    assert_eq!(rc, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(j["state"], "held", "still held after the refusal: {json}");
    fs::write(&go, "").unwrap();
    let st = s.wait_timeout(Duration::from_secs(30));
    let (said, err) = (s.stdout(), s.stderr());
    assert!(st.success(), "{said} {err}");
    assert!(
        said.contains("unlock 0"),
        "the script's unlock: {said} {err}"
    );
    assert!(said.contains("after 0"), "free again at once: {said} {err}");
}
