//! Takes and releases a lease on LOCK, COUNT times, uncontended: the library's acquire and
//! release paths, and nothing else, for an instruction count (`benches/compare/instructions.sh`
//! runs it under `valgrind --tool=callgrind` with two counts and takes the difference per
//! round, so that start-up and exit cancel out).
//!
//! ```text
//! cargo run --release -p leasehold-lib --example acquire_release -- /dev/shm/x.lock 100
//! ```

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let lock = args.next().ok_or("usage: acquire_release LOCK COUNT")?;
    let count: u32 = args
        .next()
        .ok_or("usage: acquire_release LOCK COUNT")?
        .to_str()
        .ok_or("COUNT must be a number")?
        .parse()?;
    let mut acquirer = leasehold::LeaseBuilder::new(lock)
        .ttl(Duration::from_secs(30))
        .acquirer();
    for _ in 0..count {
        acquirer.try_acquire()?.release()?;
    }
    Ok(())
}
