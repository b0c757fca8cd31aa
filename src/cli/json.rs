//! The JSON `leasehold status --json` prints for a verdict.
//!
//! Owns: the field names and shapes of that output (documented in the README; scripts parse it).
//! Must never: escape or shorten values (JSON carries the raw ones), or read anything from disk.

use serde_json::{Value, json};

use leasehold::Verdict;

/// The machine-readable form of `v`, as `leasehold status --json` prints it.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("job.lock");
/// let g = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
/// let v = leasehold::status(&lock)?;
/// assert_eq!(leasehold_cli::cli::json::verdict(&v)["token"], g.token());
/// # Ok(()) }
/// ```
pub fn verdict(v: &Verdict) -> Value {
    let l = v.lease.as_ref();
    let h = l.map(|l| &l.holder);
    json!({
        "path": v.path.display().to_string(),
        "state": v.state,
        "reason": v.reason,
        "token": l.map(|l| l.token),
        "lease_id": l.map(|l| l.lease_id.clone()),
        "lease_state": l.map(|l| l.state),
        "pid": h.map(|h| h.pid),
        "child_pid": h.and_then(|h| h.child_pid),
        "script_pid": h.filter(|h| h.on_behalf).and_then(|h| h.child_pid),
        "keeper_pid": h.filter(|h| h.on_behalf).map(|h| h.pid),
        "pgid": h.and_then(|h| h.pgid),
        "host": h.map(|h| h.host.clone()),
        "user": h.map(|h| h.user.clone()),
        "command": h.map(|h| h.command.clone()),
        "note": h.and_then(|h| h.note.clone()),
        "acquired_at": l.map(|l| l.acquired_at.clone()),
        "heartbeat_at": l.map(|l| l.heartbeat_at.clone()),
        "heartbeat_seq": l.map(|l| l.heartbeat_seq),
        "heartbeat_age_ms": v.heartbeat_age.map(|a| a.as_millis() as u64),
        "ttl_ms": l.map(|l| l.ttl_ms),
        // An etcd lock's owner: its etcd lease as the cluster tells it (LeaseTimeToLive).
        "etcd_lease": v.etcd_ttl.map(|t| json!({
            "id": format!("{:x}", t.lease), "ttl_remaining_s": t.remaining_s,
            "ttl_granted_s": t.granted_s,
        })),
        "same_host": v.same_host,
        "queue": v.queue.iter().map(|w| json!({
            "seq": w.seq, "pid": w.pid, "host": w.host, "user": w.user,
            "since": w.since, "command": w.command,
        })).collect::<Vec<_>>(),
        "ended": l.and_then(|l| l.ended.as_ref()).map(|e| json!({
            "at": e.at, "how": e.how, "by": e.by,
        })),
        // A shared or counted lock: its setting, and every holder of a holder file (LOCK's
        // own exclusive holder, if any, is the object itself).
        "mode": l.and_then(|l| l.mode).map(|m| json!({
            "shared": m.slots.is_none(), "slots": m.slots, "width": m.width,
        })),
        "holders": v.holders.iter().map(verdict).collect::<Vec<_>>(),
    })
}
