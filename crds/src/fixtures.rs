//! Test fixtures every crate's tests share (feature `test-support`, and this crate's own tests):
//! a cpu-only size and a fixed point in time, so that test data reads the same everywhere.

use jiff::Timestamp;

use crate::{Quantity, Resource, ResourceDetails};

/// `n` whole cpus and nothing else.
pub fn cpu(n: i64) -> ResourceDetails {
    let mut details = ResourceDetails::default();
    details.set(Resource::Cpu, Some(Quantity::from_units(n)));
    details
}

/// `seconds` after a fixed instant (2027-01-15), negative for before it.
pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap_or(Timestamp::MIN)
}
