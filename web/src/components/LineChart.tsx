// One series (`reward`, `metrics.loss`, ...) as a chart: a line per run, a step axis and a
// value axis with round ticks, the series name as its title, and a legend when several
// runs are drawn. Hovering (or focusing the chart and pressing the arrow keys) marks the
// nearest step with a guide line and shows each run's value there, in the chart and in the
// readout below it. Colours come from classes in style.css (`run-0` ... `run-7`): the
// page's Content-Security-Policy allows no `style` attributes.
import { useState } from 'preact/hooks';
import { axis, formatNumber, formatTick, Line, nearestIndex, polylinePoints, scale, steps, valuesAt } from '../chart';

export const W = 640;
export const H = 260;
const M = { left: 58, right: 16, top: 14, bottom: 44 };
/** How many run colours style.css defines. */
export const COLOURS = 8;

export const runClass = (run: number) => `run-${run % COLOURS}`;

export function LineChart({ name, lines, legend = lines.length > 1 }: { name: string; lines: Line[]; legend?: boolean }) {
  const [hover, setHover] = useState<number | null>(null);
  const all = lines.flatMap((l) => l.points);
  const xs = steps(lines);
  const ys = all.map((p) => p.y);
  const x = axis(xs[0], xs[xs.length - 1], { integer: xs.every(Number.isInteger) });
  const y = axis(Math.min(...ys), Math.max(...ys), { extend: true });
  const [left, right, top, bottom] = [M.left, W - M.right, M.top, H - M.bottom];
  const sx = scale(x.lo, x.hi, left, right);
  const sy = scale(y.lo, y.hi, bottom, top);
  const step = hover !== null && xs.length ? xs[Math.min(hover, xs.length - 1)] : null;
  const values = step !== null ? valuesAt(lines, step) : [];

  const single = lines.length === 1 ? lines[0] : null;
  const last = single?.points[single.points.length - 1];
  const summary = single
    ? `${single.points.length} points, last ${formatNumber(last!.y)} (min ${formatNumber(Math.min(...ys))}, max ${formatNumber(Math.max(...ys))})`
    : `${lines.length} runs`;
  const valueText = ({ line, point }: { line: Line; point: { x: number; y: number } }) =>
    `${lines.length > 1 ? `${line.label}: ` : ''}${formatNumber(point.y)}${point.x !== step ? ` (at step ${formatNumber(point.x, 12)})` : ''}`;
  const readout =
    step !== null
      ? `step ${formatNumber(step, 12)}: ${values.map(valueText).join(', ')}`
      : lines.map((l) => `${lines.length > 1 ? `${l.label}: ` : ''}last ${formatNumber(l.points[l.points.length - 1].y)} at step ${formatNumber(l.points[l.points.length - 1].x, 12)}`).join(', ');

  // The hovered step from the pointer: the SVG keeps its aspect ratio (style.css), so the
  // box's width maps linearly onto the view box's.
  const onPointer = (e: PointerEvent) => {
    const svg = e.currentTarget as SVGSVGElement;
    const box = svg.getBoundingClientRect();
    if (box.width <= 0 || xs.length === 0) return;
    const px = ((e.clientX - box.left) / box.width) * W;
    const invert = x.hi === x.lo ? x.lo : x.lo + ((px - left) / (right - left)) * (x.hi - x.lo);
    setHover(nearestIndex(xs, invert));
  };
  const onKey = (e: KeyboardEvent) => {
    const current = hover ?? xs.length - 1;
    const next = { ArrowLeft: current - 1, ArrowRight: current + 1, Home: 0, End: xs.length - 1 }[e.key];
    if (next === undefined) return;
    e.preventDefault();
    setHover(Math.max(0, Math.min(xs.length - 1, next)));
  };

  // The tooltip inside the chart: beside the guide line, on the side with more room.
  const tip = step !== null ? [`step ${formatNumber(step, 12)}`, ...values.map(valueText)] : [];
  const tipWidth = Math.max(...tip.map((t) => t.length), 0) * 6.6 + 14;
  const tipHeight = tip.length * 15 + 8;
  const gx = step !== null ? sx(step) : 0;
  const tipX = gx + 8 + tipWidth > right ? Math.max(left, gx - 8 - tipWidth) : gx + 8;

  return (
    <figure class="line-chart" data-series={name} data-points={all.length} data-runs={lines.length}>
      <figcaption>
        <strong class="chart-title">{name}</strong>: {summary}
      </figcaption>
      {legend ? (
        <ul class="chart-legend" aria-label={`Runs in ${name}`}>
          {lines.map((l) => (
            <li key={l.label} data-run={l.label}>
              <svg class="swatch" width="18" height="10" aria-hidden="true">
                <line x1="1" y1="5" x2="17" y2="5" class={`chart-line ${runClass(l.run)}`} />
              </svg>
              {l.label}
            </li>
          ))}
        </ul>
      ) : null}
      <svg
        class="chart-plot"
        viewBox={`0 0 ${W} ${H}`}
        role="img"
        tabIndex={0}
        aria-label={`${name} by step${lines.length > 1 ? ` for ${lines.map((l) => l.label).join(', ')}` : ''}; arrow keys move along the steps`}
        onPointerMove={onPointer}
        onPointerDown={onPointer}
        onPointerLeave={() => setHover(null)}
        onFocus={() => setHover((h) => h ?? xs.length - 1)}
        onBlur={() => setHover(null)}
        onKeyDown={onKey}
      >
        <rect x={left} y={top} width={right - left} height={bottom - top} class="chart-frame" />
        <g class="chart-axis chart-y" data-axis="y">
          {y.ticks.map((v) => (
            <g key={v}>
              <line x1={left} x2={right} y1={sy(v)} y2={sy(v)} class="chart-grid" />
              <text x={left - 6} y={sy(v)} class="chart-tick" text-anchor="end" dominant-baseline="middle">
                {formatTick(v, y.step)}
              </text>
            </g>
          ))}
        </g>
        <g class="chart-axis chart-x" data-axis="x">
          {x.ticks.map((v) => (
            <g key={v}>
              <line x1={sx(v)} x2={sx(v)} y1={bottom} y2={bottom + 5} class="chart-tick-mark" />
              <text x={sx(v)} y={bottom + 8} class="chart-tick" text-anchor="middle" dominant-baseline="hanging">
                {formatTick(v, x.step)}
              </text>
            </g>
          ))}
          <text x={(left + right) / 2} y={H - 6} class="chart-axis-label" text-anchor="middle">
            step
          </text>
        </g>
        {lines.map((l) => (
          <polyline key={l.label} data-run={l.label} points={polylinePoints(l.points, sx, sy)} class={`chart-line ${runClass(l.run)}`} fill="none" />
        ))}
        {/* A lone point has no line: a dot shows it. */}
        {lines.map((l) => (l.points.length === 1 ? <circle key={l.label} cx={sx(l.points[0].x)} cy={sy(l.points[0].y)} r="3" class={`chart-dot ${runClass(l.run)}`} /> : null))}
        {step !== null ? (
          <g class="chart-hover" data-step={step}>
            <line x1={gx} x2={gx} y1={top} y2={bottom} class="chart-guide" />
            {values.map(({ line, point }) => (
              <circle key={line.label} cx={sx(point.x)} cy={sy(point.y)} r="4" class={`chart-dot ${runClass(line.run)}`} />
            ))}
            <rect x={tipX} y={top + 4} width={tipWidth} height={tipHeight} rx="4" class="chart-tip" />
            {tip.map((t, i) => (
              <text key={i} x={tipX + 7} y={top + 8 + 15 * i} dominant-baseline="hanging" class={i === 0 ? 'chart-tip-text chart-tip-step' : `chart-tip-text ${runClass(values[i - 1].line.run)}`}>
                {t}
              </text>
            ))}
          </g>
        ) : null}
      </svg>
      <p class="chart-readout" aria-live="polite" data-testid={`readout-${name}`}>
        {readout}
      </p>
    </figure>
  );
}
