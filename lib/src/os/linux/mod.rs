//! Linux: the kernel interfaces the library needs that POSIX does not give, with the oldest
//! kernel that has each (docs/guide.md, "Linux only"; the library as a whole needs 5.3).
//!
//! Lives here:
//! - `klock.rs` — open-file-description locks (`F_OFD_SETLK`/`F_OFD_GETLK`, Linux 3.15) beside
//!   `flock(2)`, on the mutex, queue tickets and LOCK's own file;
//! - `boottime.rs` — `CLOCK_BOOTTIME` (2.6.39; timers on it 3.15), the clock of every renew
//!   deadline;
//! - `fsinfo.rs` — `statfs(2)` magic numbers and `/proc/self/mountinfo`: which file system LOCK
//!   is on, and whether its kernel locks reach other hosts; `fallocate(2)` (2.6.23) for a new
//!   record's blocks on ext4;
//! - `cancel.rs` — the `eventfd(2)` (2.6.22) behind [`Cancel`](crate::Cancel);
//! - `procfs.rs` — parsing `/proc/PID/stat` (state, group, start time, owner) and `/proc/locks`
//!   (who holds a kernel lock on an inode).
//!
//! Other Linux-only calls still live with the policy that uses them (pidfds in `wait.rs`,
//! `/proc/PID/*` in `process.rs`, inotify in `keeper.rs`/`wait.rs`, …): docs/ARCHITECTURE.md,
//! "Linux boundary", lists them and why.
//!
//! Must never: decide policy — who may hold a lock, when a lease is stale, whom to signal. These
//! modules report what the kernel says and take what they are told to take; the caller judges.

pub(crate) mod boottime;
pub(crate) mod cancel;
pub(crate) mod fsinfo;
pub(crate) mod klock;
pub(crate) mod procfs;
