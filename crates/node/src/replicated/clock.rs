//! The clock of replication's timeouts and read leases: milliseconds of
//! `CLOCK_BOOTTIME`, which only moves forward and goes on counting while
//! the machine is suspended. `CLOCK_MONOTONIC` (what `Instant` reads) stops
//! then: a primary whose machine slept would believe that its read lease
//! still held. Only durations on one node count; readings are never
//! compared between nodes.

/// Readings of one node's clock from an origin of its own.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin_ms: u64,
}

impl Clock {
    /// A clock that reads 0 now.
    pub fn start() -> Clock {
        Clock {
            origin_ms: boot_time_ms(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        boot_time_ms().saturating_sub(self.origin_ms)
    }
}

fn boot_time_ms() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec for the call to fill in.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut time) };
    assert_eq!(
        result,
        0,
        "CLOCK_BOOTTIME cannot be read: {}",
        std::io::Error::last_os_error()
    );
    time.tv_sec as u64 * 1_000 + time.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_at_zero_and_moves_forward() {
        let clock = Clock::start();
        let first = clock.now_ms();
        assert!(first < 1_000);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(clock.now_ms() >= first + 19);
    }
}
