fn main() {
    std::process::exit(leasehold::cli::main())
}
