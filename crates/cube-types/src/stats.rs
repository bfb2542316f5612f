//! A worker's view of its machine, as `GET /stats` returns it.

use serde::{Deserialize, Serialize};

/// Memory in KiB (the book's `*Kb` fields, as /proc/meminfo counts), disk in bytes for the
/// filesystem holding the worker's data directory, CPU as a fraction 0..1 of all cores over
/// the last sampling interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    #[serde(rename = "MemTotalKb")]
    pub mem_total_kb: u64,
    #[serde(rename = "MemAvailableKb")]
    pub mem_available_kb: u64,
    #[serde(rename = "MemUsedKb")]
    pub mem_used_kb: u64,
    /// 0..100.
    #[serde(rename = "MemUsedPercent")]
    pub mem_used_percent: f64,
    #[serde(rename = "DiskTotal")]
    pub disk_total: u64,
    #[serde(rename = "DiskFree")]
    pub disk_free: u64,
    #[serde(rename = "DiskUsed")]
    pub disk_used: u64,
    /// 0..1, from the difference between two samples of /proc/stat.
    #[serde(rename = "CpuUsage")]
    pub cpu_usage: f64,
    /// Cores online, so that a reader can turn `CpuUsage` into cores.
    #[serde(rename = "CpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "LoadAvg")]
    pub load_avg: LoadAvg,
    /// Tasks the worker is running now.
    #[serde(rename = "TaskCount")]
    pub task_count: usize,
}

/// The 1, 5 and 15 minute load averages of /proc/loadavg.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadAvg {
    #[serde(rename = "Last1Min")]
    pub last_1_min: f64,
    #[serde(rename = "Last5Min")]
    pub last_5_min: f64,
    #[serde(rename = "Last15Min")]
    pub last_15_min: f64,
}
