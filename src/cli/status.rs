//! `leasehold status [--json] LOCK...`: show each lock's verdict.
//!
//! Owns: looking at every LOCK named (in order), printing a readable block or JSON (one object
//! for one LOCK, an array for several), and the exit status (0 when every LOCK could be read,
//! else the first failure's). Must never: change a lease.

use serde_json::{Value, json};

use crate::cli::args::StatusArgs;
use crate::cli::{exit, json, report};

/// Runs `leasehold status` and returns the exit status.
pub(super) fn status(a: &StatusArgs) -> i32 {
    let mut code = 0;
    let mut json_out: Vec<Value> = Vec::new();
    for (i, lock) in a.locks.iter().enumerate() {
        // A file locked by the `flock` front end keeps its lease beside it.
        let lease = leasehold::existing_lease_beside(lock);
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
