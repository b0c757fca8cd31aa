//! A held lease's link to whichever store holds it: what [`crate::LeaseGuard`] keeps.
//!
//! Owns: dispatching the [`Holding`] calls to the file store's, or (with the `etcd` and `s3`
//! features) the etcd or S3 store's holding, so that one public guard type serves them all.
//! Must never: hold behaviour of its own.

use std::time::{Duration, Instant};

use super::file::FileHolding;
use super::{Holding, Ours, Release, Renewal};
use crate::error::Result;
use crate::record::Lease;

/// A held lease in some store (one per guard: the size difference between variants costs
/// nothing worth a box).
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyHolding {
    File(FileHolding),
    #[cfg(feature = "etcd")]
    Etcd(super::etcd::holding::EtcdHolding),
    #[cfg(feature = "s3")]
    S3(super::s3::holding::S3Holding),
}

/// A held section in some store.
pub(crate) enum AnySection {
    File(<FileHolding as Holding>::Section),
    #[cfg(feature = "etcd")]
    Etcd,
    #[cfg(feature = "s3")]
    S3,
}

impl From<FileHolding> for AnyHolding {
    fn from(h: FileHolding) -> Self {
        AnyHolding::File(h)
    }
}

#[cfg(feature = "s3")]
impl From<super::s3::holding::S3Holding> for AnyHolding {
    fn from(h: super::s3::holding::S3Holding) -> Self {
        AnyHolding::S3(h)
    }
}

#[cfg(feature = "etcd")]
impl From<super::etcd::holding::EtcdHolding> for AnyHolding {
    fn from(h: super::etcd::holding::EtcdHolding) -> Self {
        AnyHolding::Etcd(h)
    }
}

impl Holding for AnyHolding {
    type Section = AnySection;

    fn still_ours(&self, lease_id: &str) -> Result<Ours> {
        match self {
            AnyHolding::File(h) => h.still_ours(lease_id),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.still_ours(lease_id),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.still_ours(lease_id),
        }
    }

    fn renew(&self, lease_id: &str, bytes: &[u8]) -> std::result::Result<(), Renewal> {
        match self {
            AnyHolding::File(h) => h.renew(lease_id, bytes),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.renew(lease_id, bytes),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.renew(lease_id, bytes),
        }
    }

    fn check(&self, lease_id: &str) -> std::result::Result<(), Renewal> {
        match self {
            AnyHolding::File(h) => h.check(lease_id),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.check(lease_id),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.check(lease_id),
        }
    }

    fn watched(&self) -> Option<(std::path::PathBuf, std::ffi::OsString)> {
        match self {
            AnyHolding::File(h) => h.watched(),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.watched(),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.watched(),
        }
    }

    fn kernel_lock(&self) -> Option<std::os::fd::OwnedFd> {
        match self {
            AnyHolding::File(h) => h.kernel_lock(),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.kernel_lock(),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.kernel_lock(),
        }
    }

    fn old_locks(&self) -> Vec<std::os::fd::OwnedFd> {
        match self {
            AnyHolding::File(h) => h.old_locks(),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.old_locks(),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.old_locks(),
        }
    }

    fn enter(&self, deadline: Instant, stuck_after: Duration) -> Result<AnySection> {
        match self {
            AnyHolding::File(h) => h.enter(deadline, stuck_after).map(AnySection::File),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.enter(deadline, stuck_after).map(|()| AnySection::Etcd),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.enter(deadline, stuck_after).map(|()| AnySection::S3),
        }
    }

    fn rewrite(&self, section: &AnySection, mine: &Lease, bytes: &[u8]) -> Result<()> {
        match (self, section) {
            (AnyHolding::File(h), AnySection::File(s)) => h.rewrite(s, mine, bytes),
            #[cfg(feature = "etcd")]
            (AnyHolding::Etcd(h), AnySection::Etcd) => h.rewrite(&(), mine, bytes),
            #[cfg(feature = "s3")]
            (AnyHolding::S3(h), AnySection::S3) => h.rewrite(&(), mine, bytes),
            #[cfg(any(feature = "etcd", feature = "s3"))]
            _ => Err(crate::error::Error::Settings(
                "internal: a section of another store".into(),
            )),
        }
    }

    fn release(&self, release: Release<'_>) -> Result<()> {
        match self {
            AnyHolding::File(h) => h.release(release),
            #[cfg(feature = "etcd")]
            AnyHolding::Etcd(h) => h.release(release),
            #[cfg(feature = "s3")]
            AnyHolding::S3(h) => h.release(release),
        }
    }
}

#[cfg(all(test, not(feature = "etcd")))]
mod tests {
    #[test]
    fn an_etcd_lock_without_the_etcd_feature_is_refused_saying_how_to_build_it() {
        let url = "etcd://127.0.0.1:2379/job";
        let e = crate::LeaseBuilder::new(url).try_acquire().unwrap_err();
        assert!(e.to_string().contains("--features etcd"), "{e}");
        let e = crate::status(url).unwrap_err();
        assert!(e.to_string().contains("--features etcd"), "{e}");
        // Nothing was made on the file system for it.
        assert!(!std::path::Path::new("etcd:").exists());
    }
}

#[cfg(all(test, not(feature = "s3")))]
mod s3_tests {
    #[test]
    fn an_s3_lock_without_the_s3_feature_is_refused_saying_how_to_build_it() {
        let url = "s3://bucket/job";
        let e = crate::LeaseBuilder::new(url).try_acquire().unwrap_err();
        assert!(e.to_string().contains("--features s3"), "{e}");
        let e = crate::status(url).unwrap_err();
        assert!(e.to_string().contains("--features s3"), "{e}");
        let e = crate::break_lease(url, crate::BreakMode::Force).unwrap_err();
        assert!(e.to_string().contains("--features s3"), "{e}");
        // Nothing was made on the file system for it.
        assert!(!std::path::Path::new("s3:").exists());
    }
}
