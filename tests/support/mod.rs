//! The test support module, shared by every test binary (`#[path = "../support/mod.rs"] mod
//! support;` in each `tests/<area>/main.rs`):
//!
//! - [`proc`]: [`Proc`], the one child-process wrapper (killed and reaped on drop);
//! - [`wait`]: [`wait_until`], the one bounded poll;
//! - [`worker`]: the one worker protocol (the test binary re-run as a worker in a role);
//! - [`cs`]: [`Cs`], the one O_EXCL critical-section checker, for shell jobs, commands under
//!   `leasehold run` and library holders alike;
//! - [`procfs`]: process state from /proc, independent of the library under test;
//! - [`etcd`]: a real three-member etcd cluster on loopback ports, for the etcd store;
//! - [`s3`]: a real Ceph RADOS Gateway (`tests/s3/ceph.sh`), for the S3 store;
//! - [`env`]: root, tools, and skip-or-fail (`CI` set: a missing prerequisite fails);
//! - [`library`], [`cli`], [`faults`]: helpers for library holders, the command line and fault
//!   injection.
//!
//! Everything is re-exported at the top (`support::Proc`, `support::wait_until`, ...).
// Each test binary uses a part of this tree, so unused items are allowed here. To find helpers
// no binary uses, replace this by `#![allow(unused_imports)]`, run `cargo check --tests
// --message-format short` (and with `--features etcd` for `etcd.rs`) and keep the items every
// binary reports as never used: remove them.
#![allow(dead_code, unused_imports)]

pub mod cli;
pub mod cs;
pub mod env;
pub mod etcd;
pub mod faults;
pub mod library;
pub mod proc;
pub mod procfs;
pub mod s3;
pub mod wait;
pub mod worker;

pub use self::cli::*;
pub use self::cs::{Cs, Interval, Section, rw_outcome, rw_script, slot_outcome, slot_script};
pub use self::env::*;
pub use self::faults::*;
pub use self::library::*;
pub use self::proc::*;
pub use self::procfs::*;
pub use self::wait::*;

/// The worker roles every binary offers: `holder`, `oneshot` and `exclusion` (library holders,
/// see [`library`]), `hold` and `cs` (contenders checked by [`cs`], see [`faults`]).
pub const COMMON_ROLES: &[(&str, worker::Role)] = &[
    ("holder", library::holder_role),
    ("oneshot", library::oneshot_role),
    ("exclusion", library::exclusion_role),
    ("hold", faults::hold_role),
    ("cs", faults::cs_role),
];
