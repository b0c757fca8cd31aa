//! The operating system beneath the library: the one place its kernel-specific interfaces live.
//!
//! Owns: nothing itself — it names the one supported system ([`linux`]), compiled only on Linux
//! (the `compile_error!` in `lib.rs` stops the build elsewhere with a clear message).
//! Must never: hold policy (who may hold a lock, when a lease is stale, whom to signal); that
//! stays in the modules beside `lib.rs`, which call in here.

pub(crate) mod linux;
