// Task reports as chart series: `{"type": "reward", "value": 1.5, "step": 3}` adds to
// series `reward`, `{"type": "metrics", "step": 3, "loss": 0.2}` to `metrics.loss` (every
// numeric field but `step`); x is `step` when it is a number, else the report's sequence
// number.

export interface ReportLine {
  spec?: { seq?: number; time?: string; report?: Record<string, unknown> };
}

export interface Series {
  type: string;
  points: { x: number; y: number }[];
}

/** At most this many points are kept per series (the newest). */
export const MAX_POINTS = 2000;

export function addReport(series: Map<string, Series>, line: ReportLine): boolean {
  const report = line.spec?.report;
  if (!report || typeof report.type !== 'string') return false;
  const x = typeof report.step === 'number' && Number.isFinite(report.step) ? report.step : line.spec?.seq ?? 0;
  let added = false;
  for (const [field, value] of Object.entries(report)) {
    if (field === 'type' || field === 'step' || typeof value !== 'number' || !Number.isFinite(value)) continue;
    // `value` is the report type's own number (a reward); other numbers are named metrics.
    const name = field === 'value' ? report.type : `${report.type}.${field}`;
    let s = series.get(name);
    if (!s) {
      s = { type: name, points: [] };
      series.set(name, s);
    }
    s.points.push({ x, y: value });
    if (s.points.length > MAX_POINTS) s.points.splice(0, s.points.length - MAX_POINTS);
    added = true;
  }
  return added;
}

/** The linear map from `[d0, d1]` onto `[r0, r1]` (the middle of the range when the
 * domain is a single value). */
export function scale(d0: number, d1: number, r0: number, r1: number): (v: number) => number {
  if (d1 === d0) return () => (r0 + r1) / 2;
  return (v) => r0 + ((v - d0) / (d1 - d0)) * (r1 - r0);
}

/** An SVG polyline's `points` attribute: `points` in the order reported, through `sx`, `sy`. */
export function polylinePoints(points: { x: number; y: number }[], sx: (x: number) => number, sy: (y: number) => number): string {
  return points.map((p) => `${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(' ');
}

// ---- axes: nice ticks and number formats ----

/** The "nice" tick spacing (1, 2 or 5 times a power of ten) that cuts `span` into about
 * `count` intervals; at least 1 with `integer` (steps are whole numbers). */
export function niceStep(span: number, count: number, integer = false): number {
  if (!(span > 0) || !Number.isFinite(span)) return 1;
  const raw = span / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  const fraction = raw / power;
  // The nearest of 1, 2, 5 and 10 (on a log scale), so the count stays near `count`.
  const nice = fraction >= Math.sqrt(50) ? 10 : fraction >= Math.sqrt(10) ? 5 : fraction >= Math.sqrt(2) ? 2 : 1;
  const step = nice * power;
  return integer ? Math.max(1, Math.round(step)) : step;
}

/** Rounds away the float noise of `k * step` (0.1 * 3 = 0.30000000000000004). */
const clean = (v: number) => Number(v.toPrecision(12));

export interface Axis {
  /** The domain drawn: `[lo, hi]`. */
  lo: number;
  hi: number;
  step: number;
  ticks: number[];
}

/** Ticks for data from `min` to `max`: multiples of a nice step. With `extend` the domain
 * grows to the ticks just outside the data (for values), else it is the data's extent
 * (for steps) with the ticks inside it. A single value gets a domain around it. */
export function axis(min: number, max: number, { count = 5, integer = false, extend = false }: { count?: number; integer?: boolean; extend?: boolean } = {}): Axis {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return { lo: 0, hi: 1, step: 1, ticks: [0, 1] };
  if (min > max) [min, max] = [max, min];
  if (min === max) {
    const pad = integer ? 1 : min === 0 ? 1 : Math.abs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  const step = niceStep(max - min, count, integer);
  const first = Math.ceil(clean(min / step));
  const last = Math.floor(clean(max / step));
  const lo = extend ? clean(Math.floor(clean(min / step)) * step) : min;
  const hi = extend ? clean(Math.ceil(clean(max / step)) * step) : max;
  const ticks: number[] = [];
  for (let k = extend ? Math.round(lo / step) : first; k <= (extend ? Math.round(hi / step) : last); k++) ticks.push(clean(k * step));
  return { lo, hi, step, ticks };
}

/** A value with at most `digits` significant digits, trailing zeros dropped: 7.5, 0.1235,
 * 1235000, 1.235e-7 (never 0.30000000000000004). */
export function formatNumber(v: number, digits = 4): string {
  if (!Number.isFinite(v)) return String(v);
  const n = Number(v.toPrecision(digits));
  return String(n === 0 ? 0 : n);
}

/** A tick label: as many decimals as the step needs (step 0.5 → "1.5", step 10 → "20"),
 * so neighbouring ticks never print alike, and no float noise. */
export function formatTick(v: number, step: number): string {
  const decimals = Math.min(15, Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  const n = Number(v.toFixed(decimals));
  return String(n === 0 ? 0 : n);
}

// ---- hover: the nearest step and each line's value there ----

export interface Point {
  x: number;
  y: number;
}

/** The index in `sorted` (ascending) of the value nearest `x`; -1 when empty. */
export function nearestIndex(sorted: number[], x: number): number {
  if (sorted.length === 0) return -1;
  let lo = 0;
  let hi = sorted.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0 && x - sorted[lo - 1] <= sorted[lo] - x) return lo - 1;
  return lo;
}

/** The point of `points` whose x is nearest `x` (the newest of equals: a step reported
 * again after a restart); null when there are none. */
export function nearestPoint(points: Point[], x: number): Point | null {
  let best: Point | null = null;
  let distance = Infinity;
  for (const p of points) {
    const d = Math.abs(p.x - x);
    if (d <= distance) {
      best = p;
      distance = d;
    }
  }
  return best;
}

/** One run's line in a chart: `run` is the run's index (its colour). */
export interface Line {
  run: number;
  label: string;
  points: Point[];
}

/** The distinct steps of `lines`, ascending. */
export function steps(lines: Line[]): number[] {
  const all = new Set<number>();
  for (const line of lines) for (const p of line.points) all.add(p.x);
  return [...all].sort((a, b) => a - b);
}

/** Each line's point nearest `step` (a run without that step shows its nearest one). */
export function valuesAt(lines: Line[], step: number): { line: Line; point: Point }[] {
  return lines.flatMap((line) => {
    const point = nearestPoint(line.points, step);
    return point ? [{ line, point }] : [];
  });
}

// ---- several runs overlaid ----

/** The charts of several runs: one per series name any run has (in the order they first
 * appear, run by run), each with a line per run that has it. */
export function overlay(runs: { label: string; series: Series[] }[]): { name: string; lines: Line[] }[] {
  const charts = new Map<string, Line[]>();
  runs.forEach((run, index) => {
    for (const s of run.series) {
      if (s.points.length === 0) continue;
      let lines = charts.get(s.type);
      if (!lines) {
        lines = [];
        charts.set(s.type, lines);
      }
      lines.push({ run: index, label: run.label, points: s.points });
    }
  });
  return [...charts].map(([name, lines]) => ({ name, lines }));
}

/** A task (run) to chart: `namespace/name`. */
export interface RunRef {
  namespace: string;
  name: string;
}

export const runKey = (run: RunRef) => `${run.namespace}/${run.name}`;

/** Runs from the compare route's `tasks` parameter (`ns/a,ns/b`): malformed entries and
 * repeats dropped, the order kept. */
export function parseRuns(param: string | null | undefined): RunRef[] {
  const seen = new Set<string>();
  const runs: RunRef[] = [];
  for (const entry of (param ?? '').split(',')) {
    const slash = entry.indexOf('/');
    if (slash <= 0 || slash === entry.length - 1) continue;
    const run = { namespace: entry.slice(0, slash).trim(), name: entry.slice(slash + 1).trim() };
    if (!run.namespace || !run.name || run.name.includes('/') || seen.has(runKey(run))) continue;
    seen.add(runKey(run));
    runs.push(run);
  }
  return runs;
}

/** The compare route of `runs`: `#/compare?tasks=ns/a,ns/b`. */
export function compareHref(runs: RunRef[]): string {
  const enc = (s: string) => encodeURIComponent(s);
  return `#/compare?tasks=${runs.map((r) => `${enc(r.namespace)}/${enc(r.name)}`).join(',')}`;
}
