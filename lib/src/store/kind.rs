//! Which store a LOCK names, and the one way to each networked store.
//!
//! Owns: [`Kind::of`], the one place a LOCK is parsed into a store (a file, `etcd://`,
//! `s3://`), and the dispatchers that reach a networked store for each operation — take,
//! `status`, `break`, `ack` — or, in a build without its feature, refuse it saying how to build
//! it. A new store is a folder, a [`Kind`] and a line in each dispatcher here (and one in
//! `any.rs` for its held lease).
//! Must never: hold protocol or policy (the stores and `acquire.rs` do); reach a store by any
//! test on LOCK's text but [`Kind::of`].

use std::path::Path;
use std::time::Instant;

use crate::error::Result;
use crate::verdict::Verdict;

/// Which store a LOCK names. [`Kind::of`] is the one place a LOCK is parsed into a store;
/// the dispatchers below ([`acquire_elsewhere`], [`status_elsewhere`], [`break_elsewhere`],
/// [`ack_elsewhere`]) are the one place each networked store is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lock file (anything that is not a store URL).
    File,
    /// `etcd://HOSTS/NAME` (feature `etcd`).
    Etcd,
    /// `s3://BUCKET/KEY` (feature `s3`).
    S3,
}

impl Kind {
    /// The store LOCK names.
    pub(crate) fn of(lock: &Path) -> Kind {
        let b = lock.as_os_str().as_encoded_bytes();
        if b.starts_with(b"etcd://") {
            Kind::Etcd
        } else if b.starts_with(b"s3://") {
            Kind::S3
        } else {
            Kind::File
        }
    }
}

/// Why a lock of a store this build lacks cannot be used.
#[allow(dead_code)] // with every store built in, nothing is refused
fn not_built(lock: &Path, feature: &str) -> crate::error::Error {
    crate::error::Error::Settings(format!(
        "{}: this leasehold was built without {feature} support; install it with \
         `cargo install leasehold --features {feature}`",
        lock.display()
    ))
}

/// Takes the lease on a lock kept outside the file system (`None`: LOCK is a file).
pub(crate) fn acquire_elsewhere(
    s: &crate::builder::LeaseBuilder,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Option<Result<crate::guard::LeaseGuard>> {
    let _ = (deadline, one_shot);
    Some(match Kind::of(&s.path) {
        Kind::File => return None,
        #[cfg(feature = "etcd")]
        Kind::Etcd => super::etcd::acquire::acquire(s, deadline, one_shot),
        #[cfg(feature = "s3")]
        Kind::S3 => super::s3::acquire::acquire(s, deadline, one_shot),
        #[allow(unreachable_patterns)]
        k => Err(refused(k, &s.path)),
    })
}

/// `status` of a lock kept outside the file system (`None`: LOCK is a file).
pub(crate) fn status_elsewhere(
    lock: &Path,
    me: &crate::identity::Identity,
    clock: &dyn crate::clock::Clock,
) -> Option<Result<Verdict>> {
    let _ = (me, clock);
    Some(match Kind::of(lock) {
        Kind::File => return None,
        #[cfg(feature = "etcd")]
        Kind::Etcd => super::etcd::look::status(lock, me, clock),
        #[cfg(feature = "s3")]
        Kind::S3 => super::s3::look::status(lock, me, clock),
        #[allow(unreachable_patterns)]
        k => Err(refused(k, lock)),
    })
}

/// `break` of a lock kept outside the file system (`None`: LOCK is a file).
pub(crate) fn break_elsewhere(
    lock: &Path,
    mode: &crate::status::outcome::BreakMode,
) -> Option<Result<crate::status::outcome::Broken>> {
    let _ = mode;
    Some(match Kind::of(lock) {
        Kind::File => return None,
        #[cfg(feature = "etcd")]
        Kind::Etcd => super::etcd::look::break_lease(lock, mode.clone()),
        #[cfg(feature = "s3")]
        Kind::S3 => super::s3::look::break_lease(lock, mode.clone()),
        #[allow(unreachable_patterns)]
        k => Err(refused(k, lock)),
    })
}

/// A store this build lacks.
#[allow(dead_code)] // with every store built in, nothing is refused
fn refused(k: Kind, lock: &Path) -> crate::error::Error {
    match k {
        Kind::Etcd => not_built(lock, "etcd"),
        _ => not_built(lock, "s3"),
    }
}

/// `ack` of a lock kept outside the file system (`None`: LOCK is a file), by `by`.
pub(crate) fn ack_elsewhere(lock: &Path, by: &str) -> Option<Result<crate::ending::Acked>> {
    let _ = by;
    Some(match Kind::of(lock) {
        Kind::File => return None,
        #[cfg(feature = "etcd")]
        Kind::Etcd => super::etcd::ending::ack(lock, by),
        #[cfg(feature = "s3")]
        Kind::S3 => super::s3::ending::ack(lock, by),
        #[allow(unreachable_patterns)]
        k => Err(refused(k, lock)),
    })
}
