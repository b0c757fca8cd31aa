//! Shared leases and slots on etcd (`--shared`, `--slots N`): a readers-writer lock and a
//! counting semaphore on the line of etcd's own lock recipe (PROTOCOL.md §14, *Shared leases
//! and slots*).
//!
//! Owns: the kind a key in line says (its name: `<prefix><lease id in hex>` is exclusive, as
//! `etcdctl lock` writes it; `:shared` or `:slots-N` after the id mark leasehold's shared and
//! slotted contenders), the rule that says whether a contender holds and which deletion it
//! waits for ([`place`]), the agreement of settings (every key ahead of us must use a setting
//! compatible with ours, or the contender is refused as on files), and the holders of a line
//! for `status` and `break` ([`status`], [`break_holders`]).
//! Must never: count a key whose name it does not know as anything but exclusive (an
//! `etcdctl lock` key, an older leasehold's); let a contender hold while a key ahead of it
//! that it must wait for is present; break a holder `break`'s mode does not name.

use etcd_client::KeyValue;

use super::look::{break_key, verdict, waiting};
use super::{Conn, EtcdLock};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::record::{Ending, LeaseState, Mode};
use crate::slots::Want;
use crate::status::outcome::{BreakMode, Broken};
use crate::verdict::{ServerLease, State, Verdict};

/// The name of the key of the contender holding etcd lease `id` that asks for `want`: etcd's
/// recipe's `<prefix><id in hex>` for an exclusive one (so that `etcdctl lock NAME` and
/// leasehold exclude each other), with `:shared` or `:slots-N` after it otherwise.
pub(crate) fn key(lock: &EtcdLock, id: i64, want: Want) -> String {
    match want {
        Want::Exclusive => lock.key(id),
        Want::Shared => format!("{}:shared", lock.key(id)),
        Want::Slots(n) => format!("{}:slots-{n}", lock.key(id)),
    }
}

/// What the key `kv` (under `prefix`) asks for: shared or slotted only when its name says so
/// exactly as [`key`] writes it; any other key (etcdctl's, an older leasehold's, one written by
/// hand) is exclusive.
pub(crate) fn kind(prefix: &str, kv: &impl InLine) -> Want {
    std::str::from_utf8(kv.name())
        .ok()
        .and_then(|k| k.strip_prefix(prefix))
        .map_or(Want::Exclusive, kind_of_rest)
}

/// A key in line, as the rule sees it: its name and its create revision.
pub(crate) trait InLine {
    fn name(&self) -> &[u8];
    fn rev(&self) -> i64;
}

impl InLine for KeyValue {
    fn name(&self) -> &[u8] {
        self.key()
    }
    fn rev(&self) -> i64 {
        self.create_revision()
    }
}

/// [`kind`] of a key whose name after the lock's prefix is `rest`.
fn kind_of_rest(rest: &str) -> Want {
    let Some((id, tag)) = rest.split_once(':') else {
        return Want::Exclusive;
    };
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Want::Exclusive;
    }
    match tag {
        "shared" => Want::Shared,
        t => match t.strip_prefix("slots-").and_then(|n| n.parse::<u32>().ok()) {
            Some(n) if Want::Slots(n).validate().is_ok() && t == format!("slots-{n}") => {
                Want::Slots(n)
            }
            _ => Want::Exclusive,
        },
    }
}

/// Whether a contender asking for `want` may share a lock with one whose key says `other`: an
/// exclusive and a shared one agree (on a shared lock the plain one is its exclusive holder),
/// slots only with the same number of slots — as `slots::agree` has it for files.
fn agree(want: Want, other: Want) -> bool {
    match (want, other) {
        (Want::Exclusive | Want::Shared, Want::Exclusive | Want::Shared) => true,
        (Want::Slots(n), Want::Slots(m)) => n == m,
        _ => false,
    }
}

/// What a key to wait on is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Watch {
    /// The deletion of this key.
    Key(Vec<u8>),
    /// The deletion of any key under the lock's prefix (a slot frees when any key ahead goes).
    Prefix,
}

/// Where a contender stands, by [`place`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// It holds the lock now.
    Holds,
    /// It waits for `watch` to go; `ahead` keys are in line before it.
    Waits { watch: Watch, ahead: usize },
    /// A key ahead of it uses another setting (what that key asks for).
    Mismatch(Want),
}

/// Where the contender asking for `want` whose key has create revision `rev` stands in `line`
/// (every key under `prefix`, keys only, in any order). With `ahead` the keys of lower create
/// revision, in line order:
/// - any key ahead with a setting that does not agree with ours ([`agree`]): refused;
/// - exclusive: holds when nothing is ahead (etcd's recipe, unchanged); waits for the key just
///   before ours;
/// - shared: holds when no exclusive key is ahead (a waiting exclusive contender is not
///   overtaken: FIFO, as etcd's `RWMutex` recipe); waits for the last exclusive key ahead;
/// - `--slots N`: holds when fewer than N keys are ahead; waits for any key to go.
pub(crate) fn place<K: InLine>(want: Want, prefix: &str, rev: i64, line: &[K]) -> Place {
    let mut ahead: Vec<&K> = line.iter().filter(|k| k.rev() < rev).collect();
    ahead.sort_by_key(|k| k.rev());
    if let Some(k) = ahead
        .iter()
        .map(|k| kind(prefix, *k))
        .find(|k| !agree(want, *k))
    {
        return Place::Mismatch(k);
    }
    let waits = |k: &K| Place::Waits {
        watch: Watch::Key(k.name().to_vec()),
        ahead: ahead.len(),
    };
    match want {
        Want::Exclusive => ahead.last().map_or(Place::Holds, |k| waits(k)),
        Want::Shared => ahead
            .iter()
            .rev()
            .find(|k| kind(prefix, **k) == Want::Exclusive)
            .map_or(Place::Holds, |k| waits(k)),
        Want::Slots(n) if ahead.len() < n as usize => Place::Holds,
        Want::Slots(_) => Place::Waits {
            watch: Watch::Prefix,
            ahead: ahead.len(),
        },
    }
}

/// What a waiting contender asking for `want` says it waits behind, `n` contenders besides the
/// owner being ahead of it (`None`: the owner alone).
pub(crate) fn behind(want: Want, n: usize) -> Option<String> {
    match want {
        Want::Slots(k) => Some(format!(
            "the {k} slots of this lock (--slots {k}), taken or waited for by the {} \
             contender(s) ahead",
            n + 1
        )),
        Want::Shared if n > 0 => Some(format!(
            "{n} contender(s) queued ahead (--shared waits for every exclusive one before it)"
        )),
        _ if n > 0 => Some(format!("{n} contender(s) queued ahead")),
        _ => None,
    }
}

/// The refusal of a contender asking for `want` behind a key that asks for `held`.
pub(crate) fn mismatch(lock: &EtcdLock, want: Want, held: Want) -> Error {
    Error::Mismatch {
        path: lock.url.clone(),
        held: held.setting(),
        asked: want.setting(),
    }
}

/// The keys of `line` (in line order) that hold the lock now, by [`place`] applied to each.
pub(crate) fn holders<'a, K: InLine>(prefix: &str, line: &'a [K]) -> Vec<&'a K> {
    line.iter()
        .filter(|k| place(kind(prefix, *k), prefix, k.rev(), line) == Place::Holds)
        .collect()
}

/// `Some(mode)` when the lock's owner (the first key in line) is a shared or slotted holder,
/// so that the lock is a shared one for `status` and `break`.
fn mode(prefix: &str, line: &[KeyValue], holders: usize) -> Option<Mode> {
    let width = holders as u32;
    match kind(prefix, line.first()?) {
        Want::Exclusive => None,
        Want::Shared => Some(Mode { slots: None, width }),
        Want::Slots(n) => Some(Mode {
            slots: Some(n),
            width,
        }),
    }
}

/// `3 shared holder(s) (--shared)` or `2 of 3 slots held (--slots 3)`, as files say it.
fn summary(mode: Mode, n: usize) -> String {
    match mode.slots {
        None => format!("{n} shared holder(s) (--shared)"),
        Some(max) => format!("{n} of {max} slots held (--slots {max})"),
    }
}

/// `status` of a lock whose owner is a shared or slotted holder (`None`: it is not, and the
/// exclusive owner's verdict stands): every holder's verdict (each with the cluster's word on
/// its etcd lease) in `holders`, the others in the queue, and in `lease` a released record
/// carrying the mode (no exclusive holder), as LOCK holds for a shared lock on files.
pub(crate) fn status(
    conn: &Conn,
    line: &[KeyValue],
    me: &Identity,
    clock: &dyn Clock,
) -> Result<Option<Verdict>> {
    let prefix = conn.lock.prefix();
    let held = holders(&prefix, line);
    let Some(mode) = mode(&prefix, line, held.len()) else {
        return Ok(None);
    };
    let mut vs = Vec::new();
    for kv in &held {
        let mut hv = verdict(&conn.lock, Some(kv), me, clock);
        let id = kv.lease();
        let t = conn.run("read a holder's lease", |mut c| async move {
            c.lease_time_to_live(id, None).await
        })?;
        hv.server_lease = Some(ServerLease {
            lease: id,
            remaining_s: t.ttl(),
            granted_s: t.granted_ttl(),
        });
        vs.push(hv);
    }
    let mut v = verdict(&conn.lock, held.first().copied(), me, clock);
    let worst = |s: State| vs.iter().any(|h| h.state == s);
    v.state = [State::Held, State::Hung, State::Stale]
        .into_iter()
        .find(|s| worst(*s))
        .unwrap_or(State::Held);
    v.reason = summary(mode, vs.len());
    if let Some(l) = v.lease.as_mut() {
        l.state = LeaseState::Released;
        l.mode = Some(mode);
        l.ended = Some(Ending {
            at: l.acquired_at.clone(),
            how: "no exclusive holder (a shared lock)".into(),
            by: None,
        });
    }
    // The waiters: every key that does not hold, in line order (`waiting` skips the first).
    let rest: Vec<KeyValue> = std::iter::once(line[0].clone())
        .chain(
            line.iter()
                .filter(|k| !held.iter().any(|h| h.key() == k.key()))
                .cloned(),
        )
        .collect();
    v.queue = waiting(&rest);
    v.queue_ahead = v.queue.len();
    v.holders = vs;
    Ok(Some(v))
}

/// `break` of a lock whose owner is a shared or slotted holder (`None`: it is not): by lease
/// id exactly that holder, stale-only every stale holder and no live one, forced every holder
/// — each through the one break of an owner ([`break_key`]); the first break is returned, the
/// others in its `more`. Waiters are never broken.
pub(crate) fn break_holders(
    conn: &Conn,
    line: &[KeyValue],
    how: &BreakMode,
) -> Result<Option<Broken>> {
    let prefix = conn.lock.prefix();
    let held = holders(&prefix, line);
    let Some(mode) = mode(&prefix, line, held.len()) else {
        return Ok(None);
    };
    let me = Identity::current();
    let clock = crate::clock::SystemClock;
    let chosen: Vec<&KeyValue> = match how {
        BreakMode::LeaseId(id) => held
            .iter()
            .copied()
            .filter(|k| u128::from_str_radix(id, 16).ok() == Some(k.lease() as u128))
            .collect(),
        BreakMode::Stale => held
            .iter()
            .copied()
            .filter(|k| verdict(&conn.lock, Some(k), &me, &clock).state == State::Stale)
            .collect(),
        BreakMode::Force => held.clone(),
    };
    if chosen.is_empty() {
        let ids: Vec<String> = held.iter().map(|k| format!("{:032x}", k.lease())).collect();
        return Err(Error::Refused {
            path: conn.lock.url.clone(),
            why: match how {
                BreakMode::LeaseId(id) => format!(
                    "no holder has lease id {id}: nothing broken ({})",
                    summary(mode, held.len())
                ),
                _ => format!(
                    "refusing to break a live lease: {}, none stale; break one by its lease id \
                     ({}), or by force",
                    summary(mode, held.len()),
                    ids.join(", ")
                ),
            },
        });
    }
    let mut out: Option<Broken> = None;
    for kv in chosen {
        let b = break_key(conn, Some(kv), how.clone())?;
        match &mut out {
            None => out = Some(b),
            Some(o) => o.more.push(b),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_written_as_leaseholds_shared_or_slotted_keys_are_not_exclusive() {
        let l = EtcdLock::parse(std::path::Path::new("etcd://h:1/a/b")).unwrap();
        assert_eq!(key(&l, 0x1f, Want::Exclusive), "a%2Fb/1f");
        assert_eq!(key(&l, 0x1f, Want::Shared), "a%2Fb/1f:shared");
        assert_eq!(key(&l, 0x1f, Want::Slots(3)), "a%2Fb/1f:slots-3");
        for (tag, want) in [
            ("shared", Want::Shared),
            ("slots-3", Want::Slots(3)),
            ("slots-03", Want::Exclusive),
            ("slots-0", Want::Exclusive),
            ("slots-", Want::Exclusive),
            ("Shared", Want::Exclusive),
        ] {
            assert_eq!(kind_of_rest(&format!("1f:{tag}")), want, "{tag}");
        }
        assert_eq!(kind_of_rest(":shared"), Want::Exclusive);
        assert_eq!(kind_of_rest("xz:shared"), Want::Exclusive);
    }

    impl InLine for (&str, i64) {
        fn name(&self) -> &[u8] {
            self.0.as_bytes()
        }
        fn rev(&self) -> i64 {
            self.1
        }
    }

    /// The names of the keys of `line` that hold.
    fn holding(line: &[(&'static str, i64)]) -> Vec<&'static str> {
        holders("p/", line).iter().map(|k| k.0).collect()
    }

    #[test]
    fn shared_holders_hold_together_up_to_the_first_exclusive_key_which_waits_for_them() {
        // etcdctl's key (no suffix) and leasehold's exclusive key are the same kind.
        let line = [
            ("p/1:shared", 5),
            ("p/2:shared", 6),
            ("p/3", 7),
            ("p/4:shared", 8),
            ("p/5:shared", 9),
        ];
        assert_eq!(holding(&line), ["p/1:shared", "p/2:shared"]);
        // A shared contender behind a waiting exclusive one waits for it, not for the others.
        assert_eq!(
            place(Want::Shared, "p/", 9, &line),
            Place::Waits {
                watch: Watch::Key(b"p/3".to_vec()),
                ahead: 4
            }
        );
        // The exclusive one waits for the key just before its own.
        assert_eq!(
            place(Want::Exclusive, "p/", 7, &line),
            Place::Waits {
                watch: Watch::Key(b"p/2:shared".to_vec()),
                ahead: 2
            }
        );
        // Once the shared ones ahead of it are gone, it alone holds.
        assert_eq!(holding(&line[2..]), ["p/3"]);
        // An exclusive owner: nobody else holds.
        let line = [("p/a", 1), ("p/b:shared", 2), ("p/c:shared", 3)];
        assert_eq!(holding(&line), ["p/a"]);
    }

    #[test]
    fn slots_admit_the_first_n_keys_and_refuse_another_setting() {
        let line = [
            ("p/1:slots-2", 3),
            ("p/2:slots-2", 4),
            ("p/3:slots-2", 5),
            ("p/4:slots-2", 6),
        ];
        assert_eq!(holding(&line), ["p/1:slots-2", "p/2:slots-2"]);
        assert_eq!(
            place(Want::Slots(2), "p/", 5, &line),
            Place::Waits {
                watch: Watch::Prefix,
                ahead: 2
            }
        );
        assert_eq!(
            place(Want::Slots(3), "p/", 7, &line),
            Place::Mismatch(Want::Slots(2))
        );
        assert_eq!(
            place(Want::Shared, "p/", 7, &line),
            Place::Mismatch(Want::Slots(2))
        );
        assert_eq!(
            place(Want::Exclusive, "p/", 7, &line),
            Place::Mismatch(Want::Slots(2))
        );
        // Behind an exclusive key (etcdctl's), a counted contender is refused.
        let line = [("p/1", 3)];
        assert_eq!(
            place(Want::Slots(2), "p/", 4, &line),
            Place::Mismatch(Want::Exclusive)
        );
    }

    #[test]
    fn settings_agree_as_on_files() {
        assert!(agree(Want::Exclusive, Want::Shared));
        assert!(agree(Want::Shared, Want::Exclusive));
        assert!(agree(Want::Slots(2), Want::Slots(2)));
        assert!(!agree(Want::Slots(2), Want::Slots(3)));
        assert!(!agree(Want::Slots(2), Want::Exclusive));
        assert!(!agree(Want::Exclusive, Want::Slots(2)));
        assert!(!agree(Want::Shared, Want::Slots(2)));
    }
}
