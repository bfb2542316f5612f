//! The machine's metrics, from /proc and statvfs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use cube_types::{LoadAvg, Stats};
use procfs::{Current, CurrentSI};
use tokio_util::sync::CancellationToken;

/// How often /proc/stat is sampled; `CpuUsage` is the busy share over the last interval.
pub const CPU_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("cannot read {what}: {reason}")]
    Read { what: &'static str, reason: String },
}

/// Busy and total CPU ticks summed over all cores at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuSample {
    busy: u64,
    total: u64,
}

/// Reads the machine's metrics. CPU usage needs two samples of /proc/stat: a loop
/// ([`StatsCollector::run_cpu_sampler`]) takes one every [`CPU_SAMPLE_INTERVAL`] and keeps the
/// share of busy time between the last two (the book divided by the time since boot).
pub struct StatsCollector {
    data_dir: PathBuf,
    /// The last sample and the usage computed from it and the one before; a `std` mutex
    /// because it is held only to copy two small values, never across an await.
    cpu: Mutex<(Option<CpuSample>, f64)>,
}

impl StatsCollector {
    /// Disk figures are for the filesystem that holds `data_dir`.
    pub fn new(data_dir: &Path) -> StatsCollector {
        StatsCollector {
            data_dir: data_dir.to_path_buf(),
            cpu: Mutex::new((cpu_sample().ok(), 0.0)),
        }
    }

    /// Samples the CPU until `shutdown` is cancelled.
    pub async fn run_cpu_sampler(&self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(CPU_SAMPLE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.sample_cpu(),
            }
        }
    }

    fn sample_cpu(&self) {
        let Ok(now) = cpu_sample() else { return };
        let mut cpu = self
            .cpu
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(before) = cpu.0 {
            cpu.1 = usage_between(before, now);
        }
        cpu.0 = Some(now);
    }

    /// The metrics now; `task_count` is supplied by the caller, who knows the tasks.
    /// The machine's size: every core online, all memory, the data directory's filesystem.
    /// A worker offers this to tasks unless its operator sets less.
    pub fn machine_capacity(&self) -> Result<cube_types::Resources, StatsError> {
        let stats = self.collect(0)?;
        Ok(cube_types::Resources {
            cpu: f64::from(stats.cpu_count),
            memory: stats.mem_total_kb * 1024,
            disk: stats.disk_total,
        })
    }

    pub fn collect(&self, task_count: usize) -> Result<Stats, StatsError> {
        let meminfo = procfs::Meminfo::current().map_err(|err| StatsError::Read {
            what: "/proc/meminfo",
            reason: err.to_string(),
        })?;
        let mem_total_kb = meminfo.mem_total / 1024;
        let mem_available_kb = meminfo.mem_available.unwrap_or(meminfo.mem_free) / 1024;
        let mem_used_kb = mem_total_kb.saturating_sub(mem_available_kb);
        let load = procfs::LoadAverage::current().map_err(|err| StatsError::Read {
            what: "/proc/loadavg",
            reason: err.to_string(),
        })?;
        let disk = rustix::fs::statvfs(&self.data_dir).map_err(|err| StatsError::Read {
            what: "the data directory's filesystem",
            reason: format!("{}: {err}", self.data_dir.display()),
        })?;
        let block = disk.f_frsize;
        let cpu_usage = self
            .cpu
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .1;
        Ok(Stats {
            mem_total_kb,
            mem_available_kb,
            mem_used_kb,
            mem_used_percent: if mem_total_kb == 0 {
                0.0
            } else {
                mem_used_kb as f64 * 100.0 / mem_total_kb as f64
            },
            disk_total: disk.f_blocks * block,
            disk_free: disk.f_bavail * block,
            disk_used: disk.f_blocks.saturating_sub(disk.f_bfree) * block,
            cpu_usage,
            cpu_count: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            load_avg: LoadAvg {
                last_1_min: two_decimals(load.one),
                last_5_min: two_decimals(load.five),
                last_15_min: two_decimals(load.fifteen),
            },
            task_count,
        })
    }
}

/// /proc/loadavg has two decimals; widening its f32 would print 0.550000011920929.
fn two_decimals(value: f32) -> f64 {
    (f64::from(value) * 100.0).round() / 100.0
}

fn cpu_sample() -> Result<CpuSample, procfs::ProcError> {
    let total = procfs::KernelStats::current()?.total;
    let idle = total.idle + total.iowait.unwrap_or(0);
    let all = total.user
        + total.nice
        + total.system
        + idle
        + total.irq.unwrap_or(0)
        + total.softirq.unwrap_or(0)
        + total.steal.unwrap_or(0);
    Ok(CpuSample {
        busy: all - idle,
        total: all,
    })
}

/// The busy share of the ticks that passed between two samples, 0 when none passed.
fn usage_between(before: CpuSample, after: CpuSample) -> f64 {
    let total = after.total.saturating_sub(before.total);
    let busy = after.busy.saturating_sub(before.busy);
    if total == 0 {
        0.0
    } else {
        (busy as f64 / total as f64).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_the_busy_share_between_two_samples_not_since_boot() {
        let boot_heavy = CpuSample {
            busy: 900_000,
            total: 1_000_000,
        };
        let later = CpuSample {
            busy: 900_025,
            total: 1_000_100,
        };
        assert_eq!(usage_between(boot_heavy, later), 0.25);
        assert_eq!(usage_between(later, later), 0.0);
    }

    #[test]
    fn real_stats_are_consistent() {
        let dir = tempfile::tempdir().unwrap();
        let collector = StatsCollector::new(dir.path());
        let stats = collector.collect(3).unwrap();
        assert!(stats.mem_total_kb > 0 && stats.mem_available_kb <= stats.mem_total_kb);
        assert_eq!(
            stats.mem_used_kb,
            stats.mem_total_kb - stats.mem_available_kb
        );
        assert!(
            stats.disk_total > 0
                && stats.disk_free <= stats.disk_total
                && stats.disk_used <= stats.disk_total
        );
        assert!((0.0..=100.0).contains(&stats.mem_used_percent));
        assert_eq!(stats.task_count, 3);
    }

    #[test]
    fn a_missing_data_directory_is_named_in_the_error() {
        let collector = StatsCollector::new(Path::new("/nonexistent/cube-data"));
        let err = collector.collect(0).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/cube-data"), "{err}");
    }
}
