//! The result of `rlark bench api`: figures, targets, analysis; printed as a table
//! (`Display`) or as JSON (`Serialize`).

use std::fmt;

use serde::Serialize;

use super::micro::CreateStepCosts;
use super::stats::{LatencySummary, SLOW_FIRST_REQUEST, Throughput};

/// Target: creates per second with 64 concurrent clients.
pub const TARGET_CREATES_PER_SEC: f64 = 5000.0;
/// Concurrency at which [`TARGET_CREATES_PER_SEC`] applies.
pub const TARGET_CREATES_CONCURRENCY: usize = 64;
/// Target: p50 of a full list of 10 000 objects, milliseconds.
pub const TARGET_LIST_P50_MS: f64 = 100.0;
/// Object count the list target is defined for.
pub const TARGET_LIST_OBJECTS: usize = 10_000;
/// Target: p99 watch delivery latency, milliseconds.
pub const TARGET_WATCH_P99_MS: f64 = 20.0;

/// Other processes keeping this many cores busy during a phase is reported as interference.
pub const INTERFERENCE_CORES: f64 = 0.2;

/// Everything `rlark bench api` measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ApiBenchReport {
    /// Where and how the run happened.
    pub environment: Environment,
    /// Reference figures measured in the same run.
    pub baselines: Baselines,
    /// `POST` creates, one entry per concurrency level.
    pub creates: Vec<Throughput>,
    /// Full lists.
    pub list: Option<ListFigures>,
    /// Watch delivery.
    pub watch: Option<WatchFigures>,
    /// In-process CPU cost of the create steps that can be timed outside the server.
    pub create_steps: Option<CreateStepCosts>,
    /// Targets with pass/miss.
    pub targets: Vec<TargetCheck>,
    /// Derived observations (overheads, batch sizes, CPU saturation).
    pub analysis: Vec<String>,
    /// Problems: failed requests, missing watch events, phases that could not run.
    pub errors: Vec<String>,
    /// Wall time of the whole run.
    pub elapsed_secs: f64,
}

/// Where and how the run happened.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Environment {
    /// CPUs available to this process.
    pub cpus: usize,
    /// `release` or `debug` (a debug build is several times slower).
    pub build: String,
    /// Data directory of the server and the store baseline.
    pub data_dir: String,
    /// Filesystem type of the data directory (`ext4`, `tmpfs`, ...), when known. On tmpfs
    /// fsync is free and create figures are not representative of a disk.
    pub filesystem: Option<String>,
    /// Request body size of one object.
    pub object_bytes: usize,
    /// The benchmarked collection.
    pub resource_path: String,
}

/// Reference figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Baselines {
    /// Raw TCP round trips on loopback: the request/response ceiling of this machine.
    pub tcp_echo: Option<Throughput>,
    /// `GET /healthz` over HTTPS keep-alive: TLS + HTTP + routing, no store.
    pub healthz: Option<Throughput>,
    /// `SqliteStore::create` called directly: the store's own ceiling.
    pub store_creates: Option<Throughput>,
}

/// Full-list figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ListFigures {
    /// The creates that topped the collection up to the requested size.
    pub fill: Option<Throughput>,
    /// Items in the (first) list response.
    pub items: usize,
    /// Size of one list response body in bytes.
    pub response_bytes: usize,
    /// The timed lists (one connection, one after another).
    pub lists: Throughput,
    /// Time to the response head of the same lists: the server's share (the body is built in
    /// full before the head is sent), the rest being TLS, transfer and the client reading.
    pub head_latency: LatencySummary,
    /// Median time to serialize the received list (parsed back into JSON values) with
    /// `serde_json::to_vec` in this process: the encoding cost alone, no IO.
    pub encode_ms: Option<f64>,
}

/// Watch delivery figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchFigures {
    /// Watchers requested.
    pub watchers: usize,
    /// Watchers whose watch was accepted (HTTP 200) before the writer started.
    pub watchers_ready: usize,
    /// The paced creates whose events were awaited.
    pub writer: Throughput,
    /// Requested writer pace, creates per second.
    pub target_rate: f64,
    /// (watcher, event) pairs expected: acknowledged creates × ready watchers.
    pub expected: usize,
    /// Pairs delivered.
    pub delivered: usize,
    /// Pairs never delivered (an error when non-zero).
    pub missing: usize,
    /// Watchers that missed at least one event.
    pub incomplete_watchers: usize,
    /// Events delivered more than once to the same watcher.
    pub duplicates: usize,
    /// Delivery latency: event received − create request sent.
    pub latency: LatencySummary,
    /// Events that arrived at a watcher before the writer had the create's response (normal:
    /// the response and the events leave the server on different connections).
    pub before_ack: usize,
}

/// One target and whether the run met it.
#[derive(Clone, Debug, Serialize)]
pub struct TargetCheck {
    /// What is measured.
    pub name: String,
    /// The target, e.g. `>= 5000 /s`.
    pub target: String,
    /// The measured value (`None`: not measured).
    pub measured: Option<f64>,
    /// Unit of `measured`.
    pub unit: String,
    /// Met.
    pub pass: bool,
    /// Why a measured value does not count, when it does not.
    pub note: Option<String>,
}

impl ApiBenchReport {
    /// Fill [`ApiBenchReport::targets`] and [`ApiBenchReport::analysis`] from the figures.
    pub fn evaluate(&mut self) {
        self.targets = self.target_checks();
        self.analysis = self.derive_analysis();
    }

    fn target_checks(&self) -> Vec<TargetCheck> {
        let mut checks = Vec::new();

        let creates = self
            .creates
            .iter()
            .find(|t| t.concurrency == TARGET_CREATES_CONCURRENCY);
        let mut note = creates
            .filter(|t| t.failed > 0)
            .map(|t| format!("{} failed creates", t.failed));
        let measured = creates.filter(|t| t.ok > 0).map(|t| t.per_sec);
        if creates.is_none() {
            note = Some(format!(
                "concurrency {TARGET_CREATES_CONCURRENCY} was not run"
            ));
        }
        checks.push(TargetCheck {
            name: format!("creates/s, {TARGET_CREATES_CONCURRENCY} clients"),
            target: format!(">= {TARGET_CREATES_PER_SEC:.0}"),
            pass: note.is_none() && measured.is_some_and(|v| v >= TARGET_CREATES_PER_SEC),
            measured,
            unit: "/s".into(),
            note,
        });

        let list = self.list.as_ref();
        let measured = list
            .filter(|l| l.lists.ok > 0)
            .map(|l| l.lists.latency.p50_ms);
        let note = match list {
            None => Some("not run".to_string()),
            Some(l) if l.lists.failed > 0 => Some(format!("{} failed lists", l.lists.failed)),
            Some(l) if l.items < TARGET_LIST_OBJECTS => Some(format!(
                "list held {} objects, not {TARGET_LIST_OBJECTS}",
                l.items
            )),
            Some(_) => None,
        };
        checks.push(TargetCheck {
            name: format!("list of {TARGET_LIST_OBJECTS} p50"),
            target: format!("<= {TARGET_LIST_P50_MS:.0}"),
            pass: note.is_none() && measured.is_some_and(|v| v <= TARGET_LIST_P50_MS),
            measured,
            unit: "ms".into(),
            note,
        });

        let watch = self.watch.as_ref();
        let measured = watch
            .filter(|w| w.latency.count > 0)
            .map(|w| w.latency.p99_ms);
        let note = match watch {
            None => Some("not run".to_string()),
            Some(w) if w.missing > 0 => Some(format!("{} events missing", w.missing)),
            Some(w) if w.watchers_ready < w.watchers => Some(format!(
                "only {} of {} watchers started",
                w.watchers_ready, w.watchers
            )),
            Some(_) => None,
        };
        checks.push(TargetCheck {
            name: watch.map_or_else(
                || "watch delivery p99".to_string(),
                |w| format!("watch delivery p99, {} watchers", w.watchers),
            ),
            target: format!("<= {TARGET_WATCH_P99_MS:.0}"),
            pass: note.is_none() && measured.is_some_and(|v| v <= TARGET_WATCH_P99_MS),
            measured,
            unit: "ms".into(),
            note,
        });
        checks
    }

    /// Every throughput row of the report.
    fn rows(&self) -> Vec<&Throughput> {
        [
            &self.baselines.tcp_echo,
            &self.baselines.store_creates,
            &self.baselines.healthz,
        ]
        .into_iter()
        .flatten()
        .chain(&self.creates)
        .chain(
            self.list
                .iter()
                .flat_map(|l| l.fill.iter().chain([&l.lists])),
        )
        .chain(self.watch.iter().map(|w| &w.writer))
        .collect()
    }

    fn derive_analysis(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let cpus = self.environment.cpus.max(1) as f64;
        let disturbed: Vec<String> = self
            .rows()
            .into_iter()
            .filter_map(|t| {
                let others = t.other_cores_busy?;
                (others >= INTERFERENCE_CORES)
                    .then(|| format!("{} x{} ({others:.2} cores)", t.name, t.concurrency))
            })
            .collect();
        if !disturbed.is_empty() {
            lines.push(format!(
                "other processes used CPU during: {}; those figures are pessimistic, rerun on a \
                 quiet machine",
                disturbed.join(", ")
            ));
        }
        let top = self.creates.iter().max_by_key(|t| t.concurrency);
        if let (Some(api), Some(store)) = (top, self.baselines.store_creates.as_ref())
            && api.per_sec > 0.0
            && store.per_sec > 0.0
        {
            let api_us = 1e6 / api.per_sec;
            let store_us = 1e6 / store.per_sec;
            lines.push(format!(
                "creates, {} clients: {:.0} µs of wall time per create over the API vs {:.0} µs \
                 store-only: the API path adds {:.0} µs per create ({:.1}x the store)",
                api.concurrency,
                api_us,
                store_us,
                api_us - store_us,
                api_us / store_us
            ));
            if let (Some(a), Some(s)) = (api.cpu_us_per_op, store.cpu_us_per_op) {
                lines.push(format!(
                    "CPU per create (server and benchmark clients together): {a:.0} µs over \
                     the API vs {s:.0} µs store-only; with {cpus:.0} CPU(s) the CPU alone caps \
                     API creates at ~{:.0}/s",
                    cpus * 1e6 / a
                ));
            }
        }
        if let (Some(steps), Some(api), Some(store), Some(healthz)) = (
            &self.create_steps,
            top.and_then(|t| t.cpu_us_per_op),
            self.baselines
                .store_creates
                .as_ref()
                .and_then(|t| t.cpu_us_per_op),
            self.baselines
                .healthz
                .as_ref()
                .and_then(|t| t.cpu_us_per_op),
        ) {
            let extra = api - store;
            lines.push(format!(
                "of the {extra:.0} µs CPU a create over the API costs beyond the store: TLS + \
                 HTTP/1.1 (both ends) ~{healthz:.0} µs as for /healthz; timed in-process: parse \
                 {:.1}, validate {:.1}, deep clone {:.1}, encode {:.1} µs; the remaining ~{:.0} \
                 µs is request routing, schema/field validation, admission and the rest of the \
                 handler (the benchmark client only sends prepared bytes)",
                steps.parse_us,
                steps.validate_us,
                steps.clone_us,
                steps.encode_us,
                (extra - healthz - steps.total_us()).max(0.0)
            ));
        }
        if let Some(h) = &self.baselines.healthz
            && let Some(cpu) = h.cpu_us_per_op
        {
            lines.push(format!(
                "HTTPS request floor: {cpu:.0} µs CPU per GET /healthz (TLS + HTTP/1.1 on both \
                 ends, no store), i.e. at most ~{:.0} requests/s on {cpus:.0} CPU(s)",
                cpus * 1e6 / cpu
            ));
        }
        for t in self
            .creates
            .iter()
            .chain(self.baselines.store_creates.as_ref())
        {
            if let Some(busy) = t.cpu_cores_busy
                && busy >= 0.85 * cpus
            {
                lines.push(format!(
                    "{} with {} clients was CPU-bound ({busy:.2} of {cpus:.0} cores busy)",
                    t.name, t.concurrency
                ));
            }
            if let Some(w) = t.writes_per_commit {
                lines.push(format!(
                    "{} with {} clients: {w:.1} writes per store commit (group commit)",
                    t.name, t.concurrency
                ));
            }
        }
        let rows: Vec<&Throughput> = self
            .baselines
            .healthz
            .iter()
            .chain(&self.creates)
            .chain(
                self.list
                    .iter()
                    .flat_map(|l| l.fill.iter().chain([&l.lists])),
            )
            .collect();
        let warmed: usize = rows
            .iter()
            .filter_map(|t| t.first_request.as_ref())
            .map(|s| s.count)
            .sum();
        let slow: usize = rows.iter().map(|t| t.slow_first_requests).sum();
        if warmed > 0 {
            let max = rows
                .iter()
                .filter_map(|t| t.first_request.as_ref())
                .map(|s| s.max_ms)
                .fold(0.0, f64::max);
            lines.push(format!(
                "first request on a fresh connection (untimed warm-up right after the TLS \
                 handshake): {slow} of {warmed} took >= {} ms, max {max:.1} ms (with many \
                 clients connecting at once this includes queueing behind their handshakes)",
                SLOW_FIRST_REQUEST.as_millis()
            ));
        }
        // One client on an otherwise idle server: a slow first request is not queueing.
        let lone_stall = rows
            .iter()
            .filter(|t| t.concurrency == 1 && t.latency.count > 0)
            .filter_map(|t| Some((t, t.first_request.as_ref()?)))
            .find(|(t, first)| first.max_ms >= 35.0 && t.latency.p99_ms < 20.0);
        if let Some((t, first)) = lone_stall {
            lines.push(format!(
                "{}, 1 client: the first request on its fresh connection took {:.1} ms, the \
                 keep-alive ones p50 {:.2} ms; ~40 ms is the signature of Nagle's algorithm on \
                 the server socket meeting the client's delayed ACK (the server writes its TLS \
                 session tickets, then the response). Setting TCP_NODELAY on accepted sockets \
                 removes it",
                t.name, first.max_ms, t.latency.p50_ms
            ));
        }
        if let Some(list) = &self.list
            && list.lists.ok > 0
            && list.items > 0
        {
            let total = list.lists.latency.p50_ms;
            let head = list.head_latency.p50_ms;
            let mut line = format!(
                "list: {:.1} µs per item, {:.0} MB/s of response body at the median; {head:.1} ms \
                 until the response head (server: read the page and its cached encodings from the store; the body streams after the head), \
                 {:.1} ms after it (TLS, transfer, client reads the body)",
                total * 1000.0 / list.items as f64,
                list.response_bytes as f64 / (total / 1000.0) / 1e6,
                (total - head).max(0.0)
            );
            if let Some(encode) = list.encode_ms {
                line.push_str(&format!(
                    "; serde_json encodes the same list in {encode:.1} ms in-process"
                ));
            }
            lines.push(line);
        }
        if let Some(w) = &self.watch
            && (30.0..=50.0).contains(&w.latency.p99_ms)
            && w.latency.p50_ms < w.latency.p99_ms / 2.0
        {
            lines.push(format!(
                "watch p99 of {:.1} ms (p50 {:.2} ms) sits at the ~40 ms delayed-ACK interval: \
                 an event written while the previous one is unacknowledged waits for the \
                 watcher's delayed ACK (Nagle's algorithm on the server socket); TCP_NODELAY on \
                 accepted sockets removes it",
                w.latency.p99_ms, w.latency.p50_ms
            ));
        }
        if let Some(w) = &self.watch
            && w.writer.ok > 0
        {
            let rate = w.writer.per_sec;
            lines.push(format!(
                "watch: writer achieved {rate:.0} creates/s of {:.0} requested; the server \
                 sent {:.0} events/s to {} watchers",
                w.target_rate,
                rate * w.watchers_ready as f64,
                w.watchers_ready
            ));
        }
        lines
    }
}

fn opt(v: Option<f64>, precision: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.precision$}"))
}

fn bytes(n: usize) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", n / (1024.0 * 1024.0))
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n:.0} B")
    }
}

const THROUGHPUT_HEADER: &str = "  what                                      conc       ok  failed      ops/s   p50 ms   p99 ms   max ms  CPU µs/op  conns  others";

fn throughput_row(f: &mut fmt::Formatter<'_>, t: &Throughput) -> fmt::Result {
    writeln!(
        f,
        "  {:<40} {:>5} {:>8} {:>7} {:>10.1} {:>8.2} {:>8.2} {:>8.2} {:>10} {:>6} {:>7}",
        t.name,
        t.concurrency,
        t.ok,
        t.failed,
        t.per_sec,
        t.latency.p50_ms,
        t.latency.p99_ms,
        t.latency.max_ms,
        opt(t.cpu_us_per_op, 0),
        if t.connections == 0 {
            "-".to_string()
        } else {
            t.connections.to_string()
        },
        opt(t.other_cores_busy, 2)
    )?;
    if let Some(e) = &t.first_error {
        writeln!(f, "      first error: {e}")?;
    }
    Ok(())
}

impl fmt::Display for ApiBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env = &self.environment;
        writeln!(
            f,
            "rlark bench api: {} build, {} CPU(s), data dir {} ({}), {} Job bodies",
            env.build,
            env.cpus,
            env.data_dir,
            env.filesystem.as_deref().unwrap_or("unknown filesystem"),
            bytes(env.object_bytes)
        )?;
        if env.build == "debug" {
            writeln!(
                f,
                "  (debug build: figures are not representative; use --release)"
            )?;
        }

        writeln!(f, "\nBaselines (same run, same machine)")?;
        writeln!(f, "{THROUGHPUT_HEADER}")?;
        for t in [
            &self.baselines.tcp_echo,
            &self.baselines.healthz,
            &self.baselines.store_creates,
        ]
        .into_iter()
        .flatten()
        {
            throughput_row(f, t)?;
        }

        writeln!(
            f,
            "\nCreates over HTTPS keep-alive (POST {})",
            env.resource_path
        )?;
        writeln!(f, "{THROUGHPUT_HEADER}")?;
        for t in &self.creates {
            throughput_row(f, t)?;
        }

        if let Some(list) = &self.list {
            writeln!(f, "\nFull list (GET {}, no limit)", env.resource_path)?;
            if let Some(fill) = &list.fill {
                writeln!(f, "  filled with:")?;
                throughput_row(f, fill)?;
            }
            writeln!(
                f,
                "  {} items, {} per response; {} lists: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms \
                 ({} failed)",
                list.items,
                bytes(list.response_bytes),
                list.lists.ok,
                list.lists.latency.p50_ms,
                list.lists.latency.p99_ms,
                list.lists.latency.max_ms,
                list.lists.failed
            )?;
            writeln!(
                f,
                "  time to response head: p50 {:.1} ms, p99 {:.1} ms; in-process JSON encode of \
                 the list: {} ms",
                list.head_latency.p50_ms,
                list.head_latency.p99_ms,
                opt(list.encode_ms, 1)
            )?;
            if let Some(e) = &list.lists.first_error {
                writeln!(f, "      first error: {e}")?;
            }
        }

        if let Some(w) = &self.watch {
            writeln!(
                f,
                "\nWatch delivery ({} watchers ready of {}, writer paced at {:.0}/s)",
                w.watchers_ready, w.watchers, w.target_rate
            )?;
            writeln!(f, "  writer:")?;
            throughput_row(f, &w.writer)?;
            writeln!(
                f,
                "  delivered {}/{} (missing {}, incomplete watchers {}, duplicates {}, \
                 before ack {})",
                w.delivered,
                w.expected,
                w.missing,
                w.incomplete_watchers,
                w.duplicates,
                w.before_ack
            )?;
            writeln!(
                f,
                "  latency (received - create sent): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, \
                 mean {:.2} ms",
                w.latency.p50_ms, w.latency.p99_ms, w.latency.max_ms, w.latency.mean_ms
            )?;
        }

        writeln!(f, "\nTargets")?;
        for t in &self.targets {
            let mark = if t.pass { "PASS" } else { "MISS" };
            write!(
                f,
                "  [{mark}] {:<36} {:>8} {:<3} (target {} {})",
                t.name,
                opt(t.measured, 1),
                t.unit,
                t.target,
                t.unit
            )?;
            if let Some(note) = &t.note {
                write!(f, ": {note}")?;
            }
            writeln!(f)?;
        }

        if !self.analysis.is_empty() {
            writeln!(f, "\nAnalysis")?;
            for line in &self.analysis {
                writeln!(f, "  - {line}")?;
            }
        }
        if !self.errors.is_empty() {
            writeln!(f, "\nErrors")?;
            for e in &self.errors {
                writeln!(f, "  ! {e}")?;
            }
        }
        writeln!(f, "\nTotal time {:.1} s", self.elapsed_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throughput(concurrency: usize, per_sec: f64) -> Throughput {
        Throughput {
            name: "POST jobs".into(),
            concurrency,
            requests: 100,
            ok: 100,
            per_sec,
            latency: LatencySummary {
                count: 100,
                p50_ms: 1.0,
                p99_ms: 2.0,
                max_ms: 3.0,
                mean_ms: 1.1,
            },
            cpu_us_per_op: Some(400.0),
            cpu_cores_busy: Some(1.9),
            ..Throughput::default()
        }
    }

    fn report() -> ApiBenchReport {
        let mut report = ApiBenchReport {
            environment: Environment {
                cpus: 2,
                build: "release".into(),
                data_dir: "/tmp/x".into(),
                filesystem: Some("ext4".into()),
                object_bytes: 1024,
                resource_path: "/apis/rlinf.io/v1alpha1/jobs".into(),
            },
            creates: vec![throughput(1, 500.0), throughput(64, 6000.0)],
            list: Some(ListFigures {
                fill: None,
                items: 10_000,
                response_bytes: 12_000_000,
                lists: Throughput {
                    ok: 20,
                    latency: LatencySummary {
                        count: 20,
                        p50_ms: 120.0,
                        ..LatencySummary::default()
                    },
                    ..Throughput::default()
                },
                head_latency: LatencySummary {
                    count: 20,
                    p50_ms: 90.0,
                    ..LatencySummary::default()
                },
                encode_ms: Some(70.0),
            }),
            watch: Some(WatchFigures {
                watchers: 100,
                watchers_ready: 100,
                expected: 1000,
                delivered: 999,
                missing: 1,
                latency: LatencySummary {
                    count: 999,
                    p99_ms: 5.0,
                    ..LatencySummary::default()
                },
                ..WatchFigures::default()
            }),
            ..ApiBenchReport::default()
        };
        report.baselines.store_creates = Some(Throughput {
            cpu_us_per_op: Some(100.0),
            ..throughput(64, 30_000.0)
        });
        report.baselines.healthz = Some(Throughput {
            cpu_us_per_op: Some(50.0),
            ..throughput(64, 90_000.0)
        });
        report.create_steps = Some(CreateStepCosts {
            parse_us: 10.0,
            validate_us: 20.0,
            clone_us: 5.0,
            encode_us: 5.0,
            iterations: 1,
        });
        report.creates[0].first_request = Some(LatencySummary {
            count: 1,
            p50_ms: 41.0,
            p99_ms: 41.0,
            max_ms: 41.0,
            mean_ms: 41.0,
        });
        report.creates[0].slow_first_requests = 1;
        report.evaluate();
        report
    }

    #[test]
    fn targets_pass_and_miss() {
        let report = report();
        let pass: Vec<bool> = report.targets.iter().map(|t| t.pass).collect();
        // Creates meet 5000/s; the list p50 of 120 ms misses; the watch p99 is fast but an
        // event is missing, which is a miss.
        assert_eq!(pass, [true, false, false]);
        assert_eq!(report.targets[0].measured, Some(6000.0));
        assert_eq!(report.targets[2].note.as_deref(), Some("1 events missing"));
    }

    #[test]
    fn delayed_ack_signature_is_named() {
        let mut report = report();
        if let Some(w) = report.watch.as_mut() {
            w.missing = 0;
            w.latency.p50_ms = 0.5;
            w.latency.p99_ms = 41.0;
        }
        report.evaluate();
        assert!(!report.targets[2].pass);
        assert!(
            report
                .analysis
                .iter()
                .any(|l| l.starts_with("watch p99 of 41.0 ms") && l.contains("TCP_NODELAY")),
            "{:?}",
            report.analysis
        );
    }

    #[test]
    fn missing_phases_are_misses_not_passes() {
        let mut report = ApiBenchReport::default();
        report.evaluate();
        assert!(
            report
                .targets
                .iter()
                .all(|t| !t.pass && t.measured.is_none())
        );
    }

    #[test]
    fn table_and_json_render() {
        let report = report();
        let text = report.to_string();
        assert!(text.contains("[PASS] creates/s, 64 clients"), "{text}");
        assert!(text.contains("[MISS] list of 10000 p50"), "{text}");
        assert!(text.contains("the API path adds"), "{text}");
        assert!(text.contains("1 of 1 took >= 20 ms"), "{text}");
        assert!(text.contains("Setting TCP_NODELAY"), "{text}");
        // 400 - 100 µs beyond the store; 50 TLS/HTTP, 40 timed steps, 210 rest.
        assert!(text.contains("of the 300 µs CPU"), "{text}");
        assert!(text.contains("the remaining ~210 µs"), "{text}");
        assert!(text.contains("90.0 ms until the response head"), "{text}");
        assert!(text.contains("30.0 ms after it"), "{text}");
        let json = serde_json::to_value(&report).expect("serialize");
        assert_eq!(json["creates"][1]["concurrency"], 64);
        assert_eq!(json["targets"][1]["pass"], false);
    }
}
