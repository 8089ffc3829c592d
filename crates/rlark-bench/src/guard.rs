//! The guard against performance regressions: every `rlark bench` reduces its run to CPU
//! per operation on each measured path, divided by the CPU per operation of a baseline
//! measured in the same run on the same machine (loopback TCP, store-only creates, direct
//! TCP between the same namespaces). A ratio, unlike a rate, survives a busier or a faster
//! machine; `--compare FILE` checks today's ratios against a committed file of earlier ones
//! and flags every ratio that got more than [`WORSE_BY`] worse.
//!
//! The committed file is `docs/bench-ratios.json` (written with `--write-ratios FILE` from a
//! release build; docs/benchmarks.md, "The regression guard").

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// A ratio more than this fraction above the committed one is a regression (issue 20:
/// "more than 25% worse").
pub const WORSE_BY: f64 = 0.25;

/// Version of the ratio file's layout.
const FILE_VERSION: u32 = 1;

/// One guarded figure: what one operation of `name` costs in CPU, against what one
/// operation of `baseline` cost in the same run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GuardRatio {
    /// The measured path, stable across runs: the key in the ratio file.
    pub name: String,
    /// Unit of both CPU figures (`µs/op`, `s/GiB`).
    pub unit: String,
    /// CPU per operation of the path.
    pub cpu_per_op: f64,
    /// The baseline it is divided by.
    pub baseline: String,
    /// CPU per operation of the baseline.
    pub baseline_cpu_per_op: f64,
    /// `cpu_per_op / baseline_cpu_per_op`: lower is better.
    pub ratio: f64,
}

impl GuardRatio {
    /// `None` when either figure is missing, not finite or not positive (a phase that did
    /// not run, or ran too briefly to read CPU time): nothing to guard then.
    pub fn new(
        name: impl Into<String>,
        unit: &str,
        cpu_per_op: Option<f64>,
        baseline: impl Into<String>,
        baseline_cpu_per_op: Option<f64>,
    ) -> Option<Self> {
        let (cpu, base) = (cpu_per_op?, baseline_cpu_per_op?);
        if !(cpu.is_finite() && base.is_finite() && cpu > 0.0 && base > 0.0) {
            return None;
        }
        Some(Self {
            name: name.into(),
            unit: unit.to_string(),
            cpu_per_op: cpu,
            baseline: baseline.into(),
            baseline_cpu_per_op: base,
            ratio: cpu / base,
        })
    }
}

/// A report that can be guarded.
pub trait Guarded {
    /// The bench's name in the ratio file (`api`, `tunnel`, ...).
    fn bench(&self) -> &'static str;
    /// Its ratios, in a stable order.
    fn ratios(&self) -> Vec<GuardRatio>;
}

/// Print `ratios` as a table under a heading.
pub struct RatioTable<'a>(pub &'a [GuardRatio]);

impl fmt::Display for RatioTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nCPU per operation against the same run's baseline (the regression guard)"
        )?;
        if self.0.is_empty() {
            return writeln!(f, "  (no phase measured CPU: nothing to guard)");
        }
        writeln!(
            f,
            "  {:<34} {:>12} {:<28} {:>12} {:>8}",
            "PATH", "CPU/OP", "BASELINE", "BASE CPU/OP", "RATIO"
        )?;
        for r in self.0 {
            writeln!(
                f,
                "  {:<34} {:>12} {:<28} {:>12} {:>8.2}",
                r.name,
                format!("{:.3} {}", r.cpu_per_op, r.unit),
                r.baseline,
                format!("{:.3} {}", r.baseline_cpu_per_op, r.unit),
                r.ratio
            )?;
        }
        Ok(())
    }
}

/// The committed ratios: bench → path → ratio.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioFile {
    pub version: u32,
    /// Where the ratios came from (commit, build, machine), for the reader.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub measured: String,
    pub benches: BTreeMap<String, BTreeMap<String, f64>>,
}

impl RatioFile {
    /// Read and check a ratio file; every problem names the file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--compare {}: read", path.display()))?;
        let file: RatioFile = serde_json::from_str(&text)
            .with_context(|| format!("--compare {}: not a ratio file", path.display()))?;
        if file.version != FILE_VERSION {
            anyhow::bail!(
                "--compare {}: version {} (this rlark reads version {FILE_VERSION})",
                path.display(),
                file.version
            );
        }
        for (bench, ratios) in &file.benches {
            for (name, ratio) in ratios {
                if !(ratio.is_finite() && *ratio > 0.0) {
                    anyhow::bail!(
                        "--compare {}: benches.{bench}.{name} is {ratio}, not a positive ratio",
                        path.display()
                    );
                }
            }
        }
        Ok(file)
    }

    /// `file` (when it exists) with `bench`'s ratios replaced by `ratios`.
    pub fn merged(existing: Option<RatioFile>, bench: &str, ratios: &[GuardRatio]) -> Self {
        let mut file = existing.unwrap_or(RatioFile {
            version: FILE_VERSION,
            ..RatioFile::default()
        });
        file.benches.insert(
            bench.to_string(),
            ratios
                .iter()
                .map(|r| (r.name.clone(), (r.ratio * 1000.0).round() / 1000.0))
                .collect(),
        );
        file
    }
}

/// One row of a comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ComparedRatio {
    pub name: String,
    /// The committed ratio, `None` for a path the file does not have.
    pub committed: Option<f64>,
    /// This run's ratio, `None` for a committed path this run did not measure.
    pub now: Option<f64>,
    /// More than [`WORSE_BY`] above the committed ratio.
    pub regressed: bool,
}

/// Today's ratios of one bench against the committed ones.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub bench: String,
    pub file: PathBuf,
    pub rows: Vec<ComparedRatio>,
}

impl Comparison {
    pub fn new(file: &Path, committed: &RatioFile, bench: &str, ratios: &[GuardRatio]) -> Self {
        let committed = committed.benches.get(bench).cloned().unwrap_or_default();
        let mut rows: Vec<ComparedRatio> = ratios
            .iter()
            .map(|r| {
                let before = committed.get(&r.name).copied();
                ComparedRatio {
                    name: r.name.clone(),
                    committed: before,
                    now: Some(r.ratio),
                    regressed: before.is_some_and(|b| r.ratio > b * (1.0 + WORSE_BY)),
                }
            })
            .collect();
        for (name, ratio) in &committed {
            if !ratios.iter().any(|r| &r.name == name) {
                rows.push(ComparedRatio {
                    name: name.clone(),
                    committed: Some(*ratio),
                    now: None,
                    regressed: false,
                });
            }
        }
        Self {
            bench: bench.to_string(),
            file: file.to_path_buf(),
            rows,
        }
    }

    /// The paths that regressed.
    pub fn regressions(&self) -> Vec<&str> {
        self.rows
            .iter()
            .filter(|r| r.regressed)
            .map(|r| r.name.as_str())
            .collect()
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ratio = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
        writeln!(
            f,
            "\nRatios against {} (bench {}; flagged: more than {:.0}% worse)",
            self.file.display(),
            self.bench,
            WORSE_BY * 100.0
        )?;
        writeln!(
            f,
            "  {:<34} {:>9} {:>9} {:>8}  ",
            "PATH", "COMMITTED", "NOW", "CHANGE"
        )?;
        for row in &self.rows {
            let change = match (row.committed, row.now) {
                (Some(b), Some(n)) => format!("{:+.0}%", (n / b - 1.0) * 100.0),
                (None, Some(_)) => "new".to_string(),
                _ => "not run".to_string(),
            };
            writeln!(
                f,
                "  {:<34} {:>9} {:>9} {:>8}  {}",
                row.name,
                ratio(row.committed),
                ratio(row.now),
                change,
                if row.regressed { "REGRESSION" } else { "" }
            )?;
        }
        let regressions = self.regressions();
        if regressions.is_empty() {
            writeln!(f, "  no ratio is more than {:.0}% worse", WORSE_BY * 100.0)
        } else {
            writeln!(
                f,
                "  {} ratio(s) more than {:.0}% worse: {}",
                regressions.len(),
                WORSE_BY * 100.0,
                regressions.join(", ")
            )
        }
    }
}

// The guarded figures of each bench. Names are the ratio file's keys: keep them stable.

impl Guarded for super::ApiBenchReport {
    fn bench(&self) -> &'static str {
        "api"
    }

    fn ratios(&self) -> Vec<GuardRatio> {
        let store = self
            .baselines
            .store_creates
            .as_ref()
            .and_then(|t| t.cpu_us_per_op);
        let echo = self
            .baselines
            .tcp_echo
            .as_ref()
            .and_then(|t| t.cpu_us_per_op);
        let mut ratios = Vec::new();
        for t in &self.creates {
            ratios.extend(GuardRatio::new(
                format!("creates@{}", t.concurrency),
                "µs/op",
                t.cpu_us_per_op,
                "store-only create",
                store,
            ));
        }
        // The store baseline guarded against the machine's floor too: the API ratios
        // above are divided by it, so a store that got slower would make them look better.
        if let Some(store_creates) = &self.baselines.store_creates {
            ratios.extend(GuardRatio::new(
                "store-only",
                "µs/op",
                store_creates.cpu_us_per_op,
                "loopback TCP round trip",
                echo,
            ));
        }
        if let Some(healthz) = &self.baselines.healthz {
            ratios.extend(GuardRatio::new(
                "healthz",
                "µs/op",
                healthz.cpu_us_per_op,
                "loopback TCP round trip",
                echo,
            ));
        }
        ratios
    }
}

impl Guarded for super::tunnel::TunnelBenchReport {
    fn bench(&self) -> &'static str {
        "tunnel"
    }

    fn ratios(&self) -> Vec<GuardRatio> {
        let per_gib = |i: usize| Some(self.cpu_s_per_gib[i]);
        [
            GuardRatio::new(
                "single-stream",
                "s/GiB",
                per_gib(1),
                "direct TCP, 1 stream",
                per_gib(0),
            ),
            GuardRatio::new(
                "8-streams",
                "s/GiB",
                per_gib(3),
                "direct TCP, 8 streams",
                per_gib(2),
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl Guarded for super::PortForwardBenchReport {
    fn bench(&self) -> &'static str {
        "port-forward"
    }

    fn ratios(&self) -> Vec<GuardRatio> {
        let path = |name: &str| self.paths.iter().find(|p| p.name == name);
        let openssh = path("OpenSSH relay");
        let Some(rlark) = path("rlark port-forward") else {
            return Vec::new();
        };
        [
            GuardRatio::new(
                "throughput",
                "s/GiB",
                rlark.relay_cpu_s_per_gib,
                "OpenSSH relay",
                openssh.and_then(|p| p.relay_cpu_s_per_gib),
            ),
            GuardRatio::new(
                "setup",
                "µs/op",
                rlark.relay_cpu_us_per_setup,
                "OpenSSH relay",
                openssh.and_then(|p| p.relay_cpu_us_per_setup),
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl Guarded for super::NetBenchReport {
    fn bench(&self) -> &'static str {
        "net"
    }

    /// Each path's whole CPU per GiB (ends + forwarding) over direct TCP's (ends only).
    fn ratios(&self) -> Vec<GuardRatio> {
        let Some(direct) = self.paths.iter().find(|p| p.name == "direct TCP") else {
            return Vec::new();
        };
        self.paths
            .iter()
            .filter(|p| p.name != "direct TCP")
            .filter_map(|p| {
                let whole = p
                    .ends_cpu_s_per_gib
                    .map(|ends| ends + p.forwarding_cpu_s_per_gib.unwrap_or(0.0));
                GuardRatio::new(
                    p.name.clone(),
                    "s/GiB",
                    whole,
                    "direct TCP",
                    direct.ends_cpu_s_per_gib,
                )
            })
            .collect()
    }
}

impl Guarded for super::ControllerBenchReport {
    fn bench(&self) -> &'static str {
        "controllers"
    }

    /// A Task placed through a Job (the Job's create, the controller's Task create,
    /// placement) against a raw Task create through the API.
    fn ratios(&self) -> Vec<GuardRatio> {
        GuardRatio::new(
            "task-placed",
            "µs/op",
            self.placement.cpu_us_per_task_placed,
            "raw Task create",
            self.baseline.cpu_us_per_create,
        )
        .into_iter()
        .collect()
    }
}

impl Guarded for super::AgentBenchReport {
    fn bench(&self) -> &'static str {
        "agent"
    }

    /// A short task started by the agent (its watch, the Pod's create and status writes,
    /// the supervisor and the program) against the same supervisor and program started
    /// directly. Raw runtime only: a Docker task's work is the engine's.
    fn ratios(&self) -> Vec<GuardRatio> {
        let Some(direct) = &self.direct_start else {
            return Vec::new();
        };
        GuardRatio::new(
            "task-start",
            "µs/op",
            self.agent_cpu_us_per_task,
            "supervisor + program started directly",
            direct.cpu_us_per_start,
        )
        .into_iter()
        .collect()
    }
}

impl Guarded for super::CameraBenchReport {
    fn bench(&self) -> &'static str {
        "camera"
    }

    /// CPU per camera frame (rendered, encoded and served to every client) against
    /// rendering and encoding a frame directly.
    fn ratios(&self) -> Vec<GuardRatio> {
        self.scenarios
            .iter()
            .filter_map(|s| {
                let (baseline, base) = match s.encoding.as_str() {
                    "jpeg" => ("render + JPEG encode a frame", self.direct_jpeg_cpu_us),
                    _ => ("render a frame", self.direct_raw_cpu_us),
                };
                GuardRatio::new(
                    format!("{}@{}", s.encoding, s.clients),
                    "µs/frame",
                    s.cpu_us_per_frame,
                    baseline,
                    base,
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(name: &str, cpu: f64, base: f64) -> GuardRatio {
        GuardRatio::new(name, "µs/op", Some(cpu), "store", Some(base)).expect("ratio")
    }

    #[test]
    fn ratios_need_two_positive_figures() {
        assert_eq!(ratio("a", 30.0, 10.0).ratio, 3.0);
        assert!(GuardRatio::new("a", "µs/op", None, "b", Some(1.0)).is_none());
        assert!(GuardRatio::new("a", "µs/op", Some(1.0), "b", Some(0.0)).is_none());
        assert!(GuardRatio::new("a", "µs/op", Some(f64::NAN), "b", Some(1.0)).is_none());
    }

    #[test]
    fn a_ratio_more_than_a_quarter_worse_is_flagged_and_nothing_else() {
        let file = RatioFile::merged(
            None,
            "api",
            &[
                ratio("creates@64", 40.0, 10.0),
                ratio("healthz", 20.0, 10.0),
            ],
        );
        let now = [
            ratio("creates@64", 50.1, 10.0), // 4.0 -> 5.01: +25.25%
            ratio("healthz", 25.0, 10.0),    // 2.0 -> 2.5: +25%, not more
            ratio("list", 1.0, 1.0),         // new
        ];
        let comparison = Comparison::new(Path::new("r.json"), &file, "api", &now);
        assert_eq!(comparison.regressions(), ["creates@64"]);
        let text = comparison.to_string();
        assert!(text.contains("REGRESSION"), "{text}");
        assert!(text.contains("new"), "{text}");
        // A committed path this run did not measure is listed, not flagged.
        let fewer = Comparison::new(Path::new("r.json"), &file, "api", &now[1..]);
        assert!(fewer.regressions().is_empty());
        assert!(fewer.to_string().contains("not run"));
        // Better is never flagged.
        let better = Comparison::new(
            Path::new("r.json"),
            &file,
            "api",
            &[ratio("healthz", 1.0, 10.0)],
        );
        assert!(better.regressions().is_empty());
    }

    #[test]
    fn the_file_round_trips_and_bad_files_name_the_problem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.json");
        let mut file = RatioFile::merged(None, "api", &[ratio("creates@64", 40.0, 10.0)]);
        file = RatioFile::merged(Some(file), "tunnel", &[ratio("single", 3.0, 1.0)]);
        std::fs::write(&path, serde_json::to_string_pretty(&file).expect("json")).expect("write");
        assert_eq!(RatioFile::load(&path).expect("load"), file);

        std::fs::write(&path, r#"{"version": 2, "benches": {}}"#).expect("write");
        let error = format!("{:#}", RatioFile::load(&path).expect_err("version"));
        assert!(error.contains("version 2"), "{error}");
        std::fs::write(&path, r#"{"version": 1, "benches": {"api": {"x": -1}}}"#).expect("write");
        let error = format!("{:#}", RatioFile::load(&path).expect_err("negative"));
        assert!(error.contains("benches.api.x"), "{error}");
        std::fs::write(&path, r#"{"version": 1, "benches": {}, "extra": 1}"#).expect("write");
        assert!(RatioFile::load(&path).is_err());
        let error = format!(
            "{:#}",
            RatioFile::load(&dir.path().join("none")).expect_err("missing")
        );
        assert!(error.contains("--compare"), "{error}");
    }
}
