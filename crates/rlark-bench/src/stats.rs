//! Latency percentiles, throughput figures and process CPU accounting for the benchmarks.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Percentiles of a set of latencies, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: usize,
    /// Median (nearest rank).
    pub p50_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
    /// Arithmetic mean.
    pub mean_ms: f64,
}

impl LatencySummary {
    /// Summarize `samples` (any order; sorted in place). All zero when empty.
    pub fn from_samples(samples: &mut [Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let total: Duration = samples.iter().sum();
        let count = samples.len();
        // `count` is at least 1 here, so `u32::try_from` only fails for > 4e9 samples.
        let mean = total / u32::try_from(count).unwrap_or(u32::MAX);
        Self {
            count,
            p50_ms: ms(percentile(samples, 50.0)),
            p99_ms: ms(percentile(samples, 99.0)),
            max_ms: ms(samples[count - 1]),
            mean_ms: ms(mean),
        }
    }
}

/// Nearest-rank percentile of sorted `samples`: the smallest sample such that at least `p`
/// percent of the samples are less than or equal to it. Zero for an empty slice.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let n = sorted.len();
    // ceil(p/100 * n) as a 1-based rank, clamped into 1..=n.
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Milliseconds as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Shortest run for which busy-core figures are given: `/proc` counts CPU time in 10 ms
/// ticks, so shorter windows give meaningless ratios.
pub const MIN_CPU_WINDOW_SECS: f64 = 0.5;

/// A first request on a fresh connection this slow is counted in
/// [`Throughput::slow_first_requests`] (a 40 ms delayed-ACK stall is the usual cause).
pub const SLOW_FIRST_REQUEST: Duration = Duration::from_millis(20);

/// Outcome of a closed-loop throughput run: `concurrency` workers issuing `requests`
/// operations in total, each waiting for its previous one.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Throughput {
    /// What was measured, e.g. `POST jobs`.
    pub name: String,
    /// Concurrent workers (each with its own connection).
    pub concurrency: usize,
    /// Operations attempted.
    pub requests: usize,
    /// Operations that succeeded.
    pub ok: usize,
    /// Operations that failed (error status, transport error or timeout).
    pub failed: usize,
    /// Wall time of the run.
    pub elapsed_secs: f64,
    /// Successful operations per second of wall time.
    pub per_sec: f64,
    /// Latency of the successful operations.
    pub latency: LatencySummary,
    /// Connections opened (equal to `concurrency` when keep-alive held throughout).
    pub connections: usize,
    /// Process CPU time (user + system, all threads: server and clients alike) per
    /// successful operation, in microseconds. `None` when `/proc/self/stat` is unreadable.
    pub cpu_us_per_op: Option<f64>,
    /// Mean number of CPU cores the process kept busy during the run.
    pub cpu_cores_busy: Option<f64>,
    /// Mean number of CPU cores other processes kept busy during the run (interference: the
    /// figures are pessimistic when this is not near zero).
    pub other_cores_busy: Option<f64>,
    /// Latency of the untimed warm-up request (`GET /healthz`) that each connection sent
    /// first, right after its TLS handshake. `None` when no connection was warmed.
    pub first_request: Option<LatencySummary>,
    /// Warm-up requests that took at least [`SLOW_FIRST_REQUEST`].
    pub slow_first_requests: usize,
    /// Mean number of object writes per store commit (group-commit batch size) during the
    /// run, when known.
    pub writes_per_commit: Option<f64>,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

/// What a worker pool hands back to [`Throughput::from_parts`].
#[derive(Debug, Default)]
pub struct WorkerOutcome {
    /// Latencies of the successful operations.
    pub latencies: Vec<Duration>,
    /// Failed operations.
    pub failed: usize,
    /// Connections the worker opened.
    pub connections: usize,
    /// Latency of the untimed first request on each fresh connection.
    pub first_requests: Vec<Duration>,
    /// The first error the worker saw.
    pub first_error: Option<String>,
}

impl WorkerOutcome {
    /// Record a failure, keeping the first message.
    pub fn fail(&mut self, error: impl std::fmt::Display) {
        self.failed += 1;
        if self.first_error.is_none() {
            self.first_error = Some(error.to_string());
        }
    }

    /// Merge another worker's outcome into this one.
    pub fn merge(&mut self, other: WorkerOutcome) {
        self.latencies.extend(other.latencies);
        self.failed += other.failed;
        self.connections += other.connections;
        self.first_requests.extend(other.first_requests);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

impl Throughput {
    /// Build the figures of one run from the merged worker outcomes.
    pub fn from_parts(
        name: impl Into<String>,
        concurrency: usize,
        mut outcome: WorkerOutcome,
        times: PhaseTimes,
    ) -> Self {
        let ok = outcome.latencies.len();
        let secs = times.elapsed.as_secs_f64();
        let cpu = times.cpu;
        Self {
            name: name.into(),
            concurrency,
            requests: ok + outcome.failed,
            ok,
            failed: outcome.failed,
            elapsed_secs: secs,
            per_sec: if secs > 0.0 { ok as f64 / secs } else { 0.0 },
            latency: LatencySummary::from_samples(&mut outcome.latencies),
            connections: outcome.connections,
            cpu_us_per_op: cpu
                .filter(|_| ok > 0)
                .map(|c| c.as_secs_f64() * 1e6 / ok as f64),
            cpu_cores_busy: cpu
                .filter(|_| secs >= MIN_CPU_WINDOW_SECS)
                .map(|c| c.as_secs_f64() / secs),
            other_cores_busy: times
                .others
                .filter(|_| secs >= MIN_CPU_WINDOW_SECS)
                .map(|c| c.as_secs_f64() / secs),
            slow_first_requests: outcome
                .first_requests
                .iter()
                .filter(|&&d| d >= SLOW_FIRST_REQUEST)
                .count(),
            first_request: (!outcome.first_requests.is_empty())
                .then(|| LatencySummary::from_samples(&mut outcome.first_requests)),
            writes_per_commit: None,
            first_error: outcome.first_error,
        }
    }
}

/// Wall clock, process CPU time and machine-wide busy CPU time at the start of a measured
/// phase.
#[derive(Debug, Clone, Copy)]
pub struct PhaseClock {
    start: Instant,
    cpu: Option<Duration>,
    machine: Option<Duration>,
}

/// What a [`PhaseClock`] measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimes {
    /// Wall time.
    pub elapsed: Duration,
    /// CPU time of this process (server and benchmark clients).
    pub cpu: Option<Duration>,
    /// CPU time of every other process on the machine: interference.
    pub others: Option<Duration>,
}

impl PhaseClock {
    /// Start measuring now.
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
            cpu: process_cpu_time(),
            machine: machine_busy_time(),
        }
    }

    /// Times since [`PhaseClock::start`] (CPU figures when `/proc` is readable).
    pub fn stop(&self) -> PhaseTimes {
        let elapsed = self.start.elapsed();
        let cpu = match (self.cpu, process_cpu_time()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        let machine = match (self.machine, machine_busy_time()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        let others = match (machine, cpu) {
            (Some(machine), Some(cpu)) => Some(machine.saturating_sub(cpu)),
            _ => None,
        };
        PhaseTimes {
            elapsed,
            cpu,
            others,
        }
    }
}

/// Clock ticks per second of `/proc` CPU times (`USER_HZ`): 100 on every mainstream Linux
/// architecture.
const USER_HZ: u64 = 100;

fn ticks(n: u64) -> Duration {
    Duration::from_millis(n * 1000 / USER_HZ)
}

/// Busy CPU time of the whole machine since boot (all CPUs, everything but idle and iowait),
/// from the first line of `/proc/stat`.
pub fn machine_busy_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    let busy: u64 = fields.iter().take(8).sum::<u64>() - fields.get(3)? - fields.get(4)?;
    Some(ticks(busy))
}

/// User plus system CPU time of this process (all threads), from `/proc/self/stat`.
///
/// Linux reports it in clock ticks of `USER_HZ`, which is 100 on every mainstream
/// architecture; `None` on other systems or when the file cannot be parsed.
pub fn process_cpu_time() -> Option<Duration> {
    cpu_time_of("self")
}

/// CPU time (user + system) of process `pid` (`"self"` for this one), from `/proc`.
pub fn cpu_time_of(pid: &str) -> Option<Duration> {
    let [utime, stime, _, _] = stat_times(pid)?;
    Some(ticks(utime + stime))
}

/// CPU time (user + system) of the children of process `pid` that it has waited for
/// (`cutime` + `cstime`: a reaped child's own reaped children included), from `/proc`.
pub fn children_cpu_time_of(pid: &str) -> Option<Duration> {
    let [_, _, cutime, cstime] = stat_times(pid)?;
    Some(ticks(cutime + cstime))
}

/// `utime`, `stime`, `cutime` and `cstime` of `/proc/<pid>/stat`, in clock ticks.
fn stat_times(pid: &str) -> Option<[u64; 4]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_times(&stat)
}

fn parse_stat_times(stat: &str) -> Option<[u64; 4]> {
    // The command name (field 2) is in parentheses and may contain spaces: skip past it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14), stime (15), cutime (16) and
    // cstime (17) are at 11 to 14.
    let field = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some([field(11)?, field(12)?, field(13)?, field(14)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn stat_times_skip_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 23 5 7 20 0 1 0";
        assert_eq!(parse_stat_times(stat), Some([17, 23, 5, 7]));
        assert_eq!(parse_stat_times("4242 (short) S 1 2"), None);
        assert_eq!(parse_stat_times("no parenthesis"), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted = millis(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&sorted, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&sorted, 0.0), Duration::from_millis(1));
        assert_eq!(percentile(&millis(&[7]), 99.0), Duration::from_millis(7));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        // Two samples: the median is the lower one, p99 the upper one.
        assert_eq!(percentile(&millis(&[1, 9]), 50.0), Duration::from_millis(1));
        assert_eq!(percentile(&millis(&[1, 9]), 99.0), Duration::from_millis(9));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let mut samples = millis(&[40, 10, 30, 20]);
        let summary = LatencySummary::from_samples(&mut samples);
        assert_eq!(summary.count, 4);
        assert_eq!(summary.p50_ms, 20.0);
        assert_eq!(summary.p99_ms, 40.0);
        assert_eq!(summary.max_ms, 40.0);
        assert_eq!(summary.mean_ms, 25.0);
        assert_eq!(
            LatencySummary::from_samples(&mut []),
            LatencySummary::default()
        );
    }

    #[test]
    fn throughput_from_outcomes() {
        let mut a = WorkerOutcome {
            latencies: millis(&[1, 2]),
            connections: 1,
            ..WorkerOutcome::default()
        };
        let mut b = WorkerOutcome {
            latencies: millis(&[3]),
            connections: 1,
            ..WorkerOutcome::default()
        };
        b.fail("boom");
        b.fail("second");
        a.merge(b);
        let times = PhaseTimes {
            elapsed: Duration::from_millis(500),
            cpu: Some(Duration::from_millis(300)),
            others: Some(Duration::from_millis(100)),
        };
        let t = Throughput::from_parts("x", 2, a, times);
        assert_eq!((t.requests, t.ok, t.failed, t.connections), (5, 3, 2, 2));
        assert_eq!(t.per_sec, 6.0);
        assert_eq!(t.first_error.as_deref(), Some("boom"));
        assert_eq!(t.cpu_us_per_op, Some(100_000.0));
        assert_eq!(t.cpu_cores_busy, Some(0.6));
        assert_eq!(t.other_cores_busy, Some(0.2));
    }

    #[test]
    fn reads_own_cpu_time_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_cpu_time().is_some());
            assert!(machine_busy_time().is_some());
        }
    }
}
