//! The command-line interface: maps flags to the library. (Being written.)

/// Runs the `leasehold` command line and returns its exit status.
pub fn main() -> i32 {
    eprintln!("leasehold: the command line is being written");
    crate::exit::SOFTWARE
}
