//! `leasehold status [--json] LOCK...`: show each lock's verdict.
//!
//! Owns: looking at every LOCK named (in order), printing a readable block or JSON (one object
//! for one LOCK, an array for several), and the exit status (0 when every LOCK could be read,
//! else the first failure's), and which lease a named file's is (its own, or the `flock` front
//! end's beside it). Must never: change a lease.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::cli::args::StatusArgs;
use crate::cli::{exit, json, report};

/// The lease the `flock` front end keeps beside `file` (see [`leasehold::existing_lease_beside`]),
/// when `status` and `break` of `file` should look there: only when `file` itself holds no
/// lease record. An ordinary LOCK is its own lease, whatever someone planted beside it (a
/// decoy `.LOCK.leasehold-flock` would otherwise be reported, or broken, in its place).
pub(super) fn flock_lease_of(file: &Path) -> Option<PathBuf> {
    let lease = leasehold::existing_flock_lease(file)?;
    (!holds_a_lease_record(file)).then_some(lease)
}

/// Whether `file` is a regular file that starts like every lease record (`{` and the format
/// field), read without following a link or blocking.
fn holds_a_lease_record(file: &Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const START: &[u8] = b"{\n  \"leasehold\": ";
    let regular = std::fs::symlink_metadata(file).is_ok_and(|m| m.file_type().is_file());
    let mut head = [0u8; START.len()];
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits(),
            )
            .open(file)
    };
    if !regular {
        return false;
    }
    // EWOULDBLOCK: a holder's release holds a lease on the file for a few microseconds
    // (PROTOCOL.md §4); never blocking, the open is answered at once. Asked again.
    let mut opened = open();
    for _ in 0..400 {
        match &opened {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_micros(100));
                opened = open();
            }
            _ => break,
        }
    }
    opened.and_then(|mut f| f.read_exact(&mut head)).is_ok() && head == START
}

/// Runs `leasehold status` and returns the exit status.
pub(super) fn status(a: &StatusArgs) -> i32 {
    let mut code = 0;
    let mut json_out: Vec<Value> = Vec::new();
    for (i, lock) in a.locks.iter().enumerate() {
        let lease = flock_lease_of(lock);
        match leasehold::status(lease.as_deref().unwrap_or(lock)) {
            Ok(v) => {
                if a.json {
                    json_out.push(json::verdict(&v));
                } else {
                    if i > 0 {
                        out!("\n");
                    }
                    out!("{}", report::status_block(&v));
                }
            }
            Err(e) => {
                say!("{}", report::error_line(&e));
                if a.json {
                    json_out.push(json!({
                        "path": lock.display().to_string(),
                        "error": e.to_string(),
                    }));
                }
                if code == 0 {
                    code = exit::exit_code(&e);
                }
            }
        }
    }
    if a.json {
        let v = if json_out.len() == 1 {
            json_out.remove(0)
        } else {
            Value::Array(json_out)
        };
        out!("{}\n", json::to_text(&v));
    }
    code
}
