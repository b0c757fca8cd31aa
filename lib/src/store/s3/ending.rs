//! `leasehold ack` of an S3 lock (PROTOCOL.md §15 *Endings*, §16).
//!
//! Owns: acknowledging the last ending the lock's object records — the same checks as on a
//! file (`ending::ack_record`: a released record, an unclean ending not acknowledged yet) —
//! by a conditional PUT of the same record with `acked`, on the ETag judged. The endings
//! themselves ride in the object's own writes (a take carries the one before it, a release
//! records its own, a break marks it), as a lock file's do. Must never: write but on the ETag
//! of the record judged; retry a write whose outcome is unknown without reading first.

use std::path::Path;

use super::{CALL_TIMEOUT, Client, Put, S3Lock};
use crate::ending::{Acked, ack_record};
use crate::error::{Error, Result};
use crate::fsio::LockContent;

/// `leasehold ack s3://BUCKET/KEY` by `by`.
pub(crate) fn ack(path: &Path, by: &str) -> Result<Acked> {
    let client = Client::new(S3Lock::parse(path)?);
    let refuse = |why: String| Error::Refused {
        path: client.lock.url.clone(),
        why,
    };
    for _ in 0..4 {
        let object = client.object(CALL_TIMEOUT)?;
        let content = object.content(&client.lock.url, 0)?;
        let (LockContent::Lease(l, _), Some(_)) = (&content, &object.etag) else {
            return Err(refuse("no ending is recorded: no lease at this key".into()));
        };
        let (write, out) = ack_record(&client.lock.url, l, by)?;
        let Some(new) = write else {
            return Ok(out);
        };
        // LOCK's record only: a shared lock's holders' records stay as they are.
        let (body, nonce) = object.with(0, &new.to_bytes());
        match client.put(&body, &object.cond(), CALL_TIMEOUT)? {
            Put::Done(_) => return Ok(out),
            // Changed since it was read (or we cannot tell): read again.
            Put::Failed => {}
            Put::Unknown(_) => {
                if client.read(CALL_TIMEOUT)?.2 == nonce {
                    return Ok(out);
                }
            }
        }
    }
    Err(refuse(
        "the lock's object kept changing: look at `leasehold status` and try again".into(),
    ))
}
