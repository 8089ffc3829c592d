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

/** The polyline of `points` scaled into a `width` × `height` box (y grows upwards). */
export function polyline(points: { x: number; y: number }[], width: number, height: number): { path: string; min: number; max: number } {
  if (points.length === 0) return { path: '', min: 0, max: 0 };
  const xs = points.map((p) => p.x);
  const ys = points.map((p) => p.y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x: number) => (x1 === x0 ? width / 2 : ((x - x0) / (x1 - x0)) * width);
  const sy = (y: number) => (y1 === y0 ? height / 2 : height - ((y - y0) / (y1 - y0)) * height);
  const path = points.map((p) => `${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(' ');
  return { path, min: y0, max: y1 };
}
