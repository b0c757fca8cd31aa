//! The `leasehold` binary. Owns: nothing but handing the process to the command line.
//! Must never: do anything else.

fn main() {
    std::process::exit(leasehold_cli::cli::main())
}
