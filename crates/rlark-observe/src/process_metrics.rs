//! The metrics every rlark process exposes beside its own, appended by
//! [`crate::metrics_endpoint::exposition`] to each scrape: the standard `process_*` family
//! (as Prometheus' Go and Python clients name it, read from `/proc/self`) and
//! `rlark_build_info{version,commit,date} 1`.
//!
//! The build information is set once by the binary ([`set_build_info`]); a process that never
//! sets it (a test) reports this crate's version with an empty commit and date.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// The labels of `rlark_build_info`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildInfo {
    /// The package version (`0.1.0`).
    pub version: String,
    /// The git commit the binary was built from (empty when unknown).
    pub commit: String,
    /// The build date, RFC 3339 (empty when unknown).
    pub date: String,
}

static BUILD_INFO: OnceLock<BuildInfo> = OnceLock::new();

/// Set what `rlark_build_info` reports; the first call wins.
pub fn set_build_info(info: BuildInfo) {
    let _ = BUILD_INFO.set(info);
}

fn build_info() -> BuildInfo {
    BUILD_INFO.get().cloned().unwrap_or_else(|| BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        ..BuildInfo::default()
    })
}

/// One reading of `/proc/self` (Linux); every field is `None` where it could not be read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_memory_bytes: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_memory_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit of open file descriptors.
    pub max_fds: Option<u64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// OS threads.
    pub threads: Option<u64>,
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold spaces and
/// parentheses, so it is skipped up to its last `)`); index 0 is field 3 (`state`).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().collect())
}

/// A sample from the contents of `/proc/self/stat`, `/proc/self/statm`, `/proc/self/limits`
/// and `/proc/stat`, the number of open descriptors, the clock tick rate and the page size.
pub fn parse_sample(
    stat: &str,
    statm: &str,
    limits: &str,
    system_stat: &str,
    open_fds: Option<u64>,
    ticks_per_second: u64,
    page_size: u64,
) -> ProcessSample {
    let ticks = ticks_per_second.max(1) as f64;
    let fields = stat_fields(stat).unwrap_or_default();
    // proc(5) numbers the fields from 1; fields[0] is field 3.
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let cpu_seconds = match (field(14), field(15)) {
        (Some(utime), Some(stime)) => Some((utime + stime) as f64 / ticks),
        _ => None,
    };
    let boot_time = system_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let start_time_seconds = match (boot_time, field(22)) {
        (Some(boot), Some(start)) => Some(boot as f64 + start as f64 / ticks),
        _ => None,
    };
    let resident_memory_bytes = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok())
        .map(|pages| pages * page_size);
    let max_fds = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line["Max open files".len()..].split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok());
    ProcessSample {
        cpu_seconds,
        resident_memory_bytes,
        virtual_memory_bytes: field(23),
        open_fds,
        max_fds,
        start_time_seconds,
        threads: field(20),
    }
}

/// This process now (all `None` where `/proc` is absent).
pub fn sample() -> ProcessSample {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        // The directory handle itself is one of the entries while it is open.
        .map(|entries| entries.count().saturating_sub(1) as u64);
    parse_sample(
        &read("/proc/self/stat"),
        &read("/proc/self/statm"),
        &read("/proc/self/limits"),
        &read("/proc/stat"),
        open_fds,
        rustix::param::clock_ticks_per_second(),
        rustix::param::page_size() as u64,
    )
}

/// A registry of this process's `process_*` metrics as `sample` read them, and
/// `rlark_build_info`.
pub fn registry(sample: &ProcessSample) -> Registry {
    let mut registry = Registry::default();
    let info = build_info();
    registry.register(
        "rlark_build",
        "Build information of this rlark binary",
        Info::new(info),
    );
    if let Some(v) = sample.cpu_seconds {
        registry.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent",
            Unit::Seconds,
            ConstCounter::new(v),
        );
    }
    let gauges: [(&str, &str, Option<Unit>, Option<f64>); 6] = [
        (
            "process_resident_memory",
            "Resident memory size",
            Some(Unit::Bytes),
            sample.resident_memory_bytes.map(|v| v as f64),
        ),
        (
            "process_virtual_memory",
            "Virtual memory size",
            Some(Unit::Bytes),
            sample.virtual_memory_bytes.map(|v| v as f64),
        ),
        (
            "process_open_fds",
            "Number of open file descriptors",
            None,
            sample.open_fds.map(|v| v as f64),
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors",
            None,
            sample.max_fds.map(|v| v as f64),
        ),
        (
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Some(Unit::Seconds),
            sample.start_time_seconds,
        ),
        (
            "process_threads",
            "Number of OS threads",
            None,
            sample.threads.map(|v| v as f64),
        ),
    ];
    for (name, help, unit, value) in gauges {
        let Some(value) = value else { continue };
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, ConstGauge::new(value)),
            None => registry.register(name, help, ConstGauge::new(value)),
        }
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (rlark (x) y) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 50 0 0 \
                        20 0 7 0 12345 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 \
                        4096 17575 0 0 0 17 1 0 0 0 0 0";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            1024                 524288               files     \n";

    #[test]
    fn proc_files_parse_to_the_standard_process_metrics() {
        let sample = parse_sample(
            STAT,
            "241128 2048 1024 1 0 2000 0",
            LIMITS,
            "cpu  1 2 3\nbtime 1764600000\nprocesses 9\n",
            Some(12),
            100,
            4096,
        );
        assert_eq!(
            sample,
            ProcessSample {
                cpu_seconds: Some(3.0),
                resident_memory_bytes: Some(2048 * 4096),
                virtual_memory_bytes: Some(987_654_321),
                open_fds: Some(12),
                max_fds: Some(1024),
                start_time_seconds: Some(1_764_600_000.0 + 123.45),
                threads: Some(7),
            }
        );
    }

    #[test]
    fn unreadable_proc_files_leave_the_metrics_out() {
        let sample = parse_sample("", "", "", "", None, 100, 4096);
        assert_eq!(sample, ProcessSample::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry(&sample)).expect("encode");
        assert!(!text.contains("process_"), "{text}");
        assert!(text.contains("rlark_build_info{version=\""), "{text}");
    }

    #[test]
    fn this_process_is_sampled_and_encoded_with_prometheus_names() {
        let sample = sample();
        assert!(sample.cpu_seconds.is_some_and(|s| s >= 0.0), "{sample:?}");
        assert!(sample.resident_memory_bytes.is_some_and(|b| b > 0));
        assert!(sample.open_fds.is_some_and(|n| n >= 3));
        assert!(sample.threads.is_some_and(|n| n >= 1));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry(&sample)).expect("encode");
        for name in [
            "# TYPE process_cpu_seconds counter",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
            "process_threads ",
            "# TYPE rlark_build info",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
