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

    /// What the machine can give tasks: every core online, all memory, and the disk space
    /// free for unprivileged use on the data directory's filesystem now (not its size: what
    /// the system, other programs and earlier runs already hold there is not Cube's to
    /// offer). A worker offers this to tasks unless its operator says otherwise.
    pub fn machine_capacity(&self) -> Result<cube_types::Resources, StatsError> {
        let stats = self.collect(0)?;
        Ok(cube_types::Resources {
            cpu: f64::from(stats.cpu_count),
            memory: stats.mem_total_kb * 1024,
            disk: stats.disk_free,
        })
    }

    /// The metrics now; `task_count` is supplied by the caller, who knows the tasks.
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
        let space =
            DiskSpace::from_statvfs(disk.f_blocks, disk.f_bfree, disk.f_bavail, disk.f_frsize);
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
            disk_total: space.total,
            disk_free: space.available,
            disk_used: space.used,
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

/// A filesystem's space in bytes, from statvfs's block counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DiskSpace {
    /// The filesystem's size.
    total: u64,
    /// What an unprivileged writer may still use (`f_bavail`): the blocks reserved for root
    /// are not counted, because containers and Cube's files should not eat into them.
    available: u64,
    /// What is written already (`f_blocks - f_bfree`), reserved blocks excluded.
    used: u64,
}

impl DiskSpace {
    /// Block counts are in units of the fragment size (`f_frsize`), not `f_bsize`. The
    /// products saturate: a filesystem that claims more than 16 EiB is not worth a panic.
    fn from_statvfs(blocks: u64, free: u64, available: u64, fragment_size: u64) -> DiskSpace {
        DiskSpace {
            total: blocks.saturating_mul(fragment_size),
            available: available.saturating_mul(fragment_size),
            used: blocks.saturating_sub(free).saturating_mul(fragment_size),
        }
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
    fn disk_space_counts_fragments_and_leaves_out_the_blocks_reserved_for_root() {
        // 1,000 blocks of 4 KiB: 300 in use, 700 free of which 50 are reserved for root.
        let space = DiskSpace::from_statvfs(1_000, 700, 650, 4096);
        assert_eq!(space.total, 4_096_000);
        assert_eq!(space.available, 650 * 4096);
        assert_eq!(space.used, 300 * 4096);
        let absurd = DiskSpace::from_statvfs(u64::MAX, 0, u64::MAX, 4096);
        assert_eq!(absurd.available, u64::MAX);
    }

    #[test]
    fn the_disk_offered_to_tasks_is_what_is_free_not_the_filesystem_size() {
        let dir = tempfile::tempdir().unwrap();
        let collector = StatsCollector::new(dir.path());
        let before = collector.collect(0).unwrap();
        let offered = collector.machine_capacity().unwrap().disk;
        let after = collector.collect(0).unwrap();
        // Other programs write and delete meanwhile: allow the offer some room around the
        // two readings taken on either side of it.
        let slack = 256 * 1024 * 1024;
        let low = before.disk_free.min(after.disk_free).saturating_sub(slack);
        let high = before.disk_free.max(after.disk_free) + slack;
        assert!(
            (low..=high).contains(&offered),
            "offered {offered}, free {} then {}, filesystem {}",
            before.disk_free,
            after.disk_free,
            before.disk_total
        );
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
