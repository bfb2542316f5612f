//! Warnings that repeat are written at most once per interval, with a count of those left
//! out: a cluster with hundreds of unreachable nodes retries thousands of times a minute, and
//! the log must stay readable (and small) all the same.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of repeated warning.
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    /// When the last one was written and how many were left out since. A `std` mutex: a
    /// comparison and a counter, never held across anything else.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimit {
    pub fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// Whether to write this one now; when so, how many were left out before it.
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (last, left_out) = &mut *state;
        match last {
            Some(at) if now.saturating_duration_since(*at) < self.interval => {
                *left_out += 1;
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_written_once_per_interval_with_the_count_left_out() {
        let limit = LogLimit::new(Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(limit.admit(start), Some(0));
        for n in 1..=100 {
            assert_eq!(limit.admit(start + Duration::from_millis(n * 10)), None);
        }
        assert_eq!(limit.admit(start + Duration::from_secs(5)), Some(100));
        assert_eq!(limit.admit(start + Duration::from_secs(6)), None);
    }
}
