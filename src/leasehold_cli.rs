//! The `leasehold` command line, as a library for `main.rs` and this package's tests.
//!
//! Owns: the command line ([`cli`]: arguments, output, exit statuses), running the guarded
//! command as a child ([`supervise`]: process-global signal handlers), and script mode's keeper
//! process ([`script`]: `leasehold lock`'s hand-over, the detached keeper). The lease protocol itself
//! is the `leasehold` crate (package `leasehold-lib`). Must never: hold protocol logic, or be
//! used as a stable API by other programs (use `leasehold-lib`).

// Linux only, as the library (README, "Linux only"): the supervisor's PDEATHSIG, child subreaper,
// signalfd and pidfds exist nowhere else.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "the leasehold command runs on Linux only (5.3 or newer): it needs pidfds, PR_SET_PDEATHSIG, \
     a child subreaper, signalfd and /proc, which this target does not have"
);

pub mod cli;
pub mod flock;
pub mod script;
pub mod supervise;

pub use cli::exit::{self, exit_code};
