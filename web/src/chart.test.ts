import { describe, expect, it } from 'vitest';
import { addReport, axis, compareHref, formatNumber, formatTick, Line, nearestIndex, nearestPoint, niceStep, overlay, parseRuns, polylinePoints, runKey, scale, Series, steps, valuesAt } from './chart';

describe('report series', () => {
  it('groups numeric reports by type, x from step else seq', () => {
    const series = new Map<string, Series>();
    expect(addReport(series, { spec: { seq: 1, report: { type: 'reward', value: 1, step: 10 } } })).toBe(true);
    expect(addReport(series, { spec: { seq: 2, report: { type: 'reward', value: 3 } } })).toBe(true);
    expect(addReport(series, { spec: { seq: 3, report: { type: 'metrics', step: 7, loss: 0.5, note: 'x' } } })).toBe(true);
    expect(addReport(series, { spec: { seq: 4, report: { type: 'progress', message: 'x' } } })).toBe(false);
    expect(addReport(series, { spec: { seq: 5, report: { type: 'reward', value: 'high' } } })).toBe(false);
    expect(series.get('reward')!.points).toEqual([
      { x: 10, y: 1 },
      { x: 2, y: 3 },
    ]);
    expect(series.get('metrics.loss')!.points).toEqual([{ x: 7, y: 0.5 }]);
    expect([...series.keys()].sort()).toEqual(['metrics.loss', 'reward']);
  });

  it('scales points into the box with y upwards', () => {
    const sx = scale(0, 10, 0, 100);
    const sy = scale(0, 5, 50, 0);
    expect(polylinePoints([{ x: 0, y: 0 }, { x: 10, y: 5 }], sx, sy)).toBe('0.0,50.0 100.0,0.0');
    // A single value sits in the middle of the range.
    expect(scale(1, 1, 0, 100)(1)).toBe(50);
  });
});

describe('axes', () => {
  it('picks 1-2-5 tick steps', () => {
    expect(niceStep(10, 5)).toBe(2);
    expect(niceStep(100, 5)).toBe(20);
    expect(niceStep(1, 5)).toBe(0.2);
    expect(niceStep(23, 5)).toBe(5);
    expect(niceStep(7, 5)).toBe(1);
    expect(niceStep(8, 5)).toBe(2);
    expect(niceStep(0.03, 5)).toBeCloseTo(0.005, 12);
    expect(niceStep(4000, 5)).toBe(1000);
    // Whole steps never tick at 0.5.
    expect(niceStep(4, 5)).toBe(1);
    expect(niceStep(4, 5, true)).toBe(1);
    expect(niceStep(2, 5, true)).toBe(1);
    expect(niceStep(0, 5)).toBe(1);
  });

  it('ticks steps inside the data and values on a domain extended to round numbers', () => {
    expect(axis(1, 97, { integer: true })).toEqual({ lo: 1, hi: 97, step: 20, ticks: [20, 40, 60, 80] });
    expect(axis(0, 10, { integer: true }).ticks).toEqual([0, 2, 4, 6, 8, 10]);
    expect(axis(1, 3, { integer: true }).ticks).toEqual([1, 2, 3]);
    const y = axis(0.13, 0.87, { extend: true });
    expect([y.lo, y.hi, y.step]).toEqual([0, 1, 0.2]);
    // No float noise: 0.6000000000000001 is 0.6.
    expect(y.ticks).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(axis(-3.2, 7.9, { extend: true }).ticks).toEqual([-4, -2, 0, 2, 4, 6, 8]);
  });

  it('gives a single value a domain around it', () => {
    expect(axis(5, 5, { integer: true })).toEqual({ lo: 4, hi: 6, step: 1, ticks: [4, 5, 6] });
    const y = axis(7.5, 7.5, { extend: true });
    expect(y.lo).toBeLessThan(7.5);
    expect(y.hi).toBeGreaterThan(7.5);
    expect(y.ticks.length).toBeGreaterThanOrEqual(2);
    expect(axis(0, 0, { extend: true }).ticks).toEqual([-1, -0.5, 0, 0.5, 1]);
    expect(axis(NaN, 1).ticks).toEqual([0, 1]);
  });

  it('formats values with four significant digits, trailing zeros dropped', () => {
    expect(formatNumber(7.5)).toBe('7.5');
    expect(formatNumber(0.1 + 0.2)).toBe('0.3');
    expect(formatNumber(2 / 3)).toBe('0.6667');
    expect(formatNumber(-1234.5678)).toBe('-1235');
    expect(formatNumber(1234567)).toBe('1235000');
    expect(formatNumber(0.000012346)).toBe('0.00001235');
    expect(formatNumber(3)).toBe('3');
    expect(formatNumber(-0)).toBe('0');
    expect(formatNumber(1.234567, 6)).toBe('1.23457');
  });

  it('formats ticks with the decimals the step needs', () => {
    expect(formatTick(0.6000000000000001, 0.2)).toBe('0.6');
    expect(formatTick(1, 0.5)).toBe('1');
    expect(formatTick(1.5, 0.5)).toBe('1.5');
    expect(formatTick(20, 10)).toBe('20');
    expect(formatTick(0.015, 0.005)).toBe('0.015');
    expect(formatTick(1000005, 5)).toBe('1000005');
    expect(formatTick(-0, 1)).toBe('0');
  });
});

describe('hover', () => {
  it('finds the nearest value in a sorted list', () => {
    expect(nearestIndex([], 3)).toBe(-1);
    expect(nearestIndex([1, 5, 10], -4)).toBe(0);
    expect(nearestIndex([1, 5, 10], 2.9)).toBe(0);
    expect(nearestIndex([1, 5, 10], 3.1)).toBe(1);
    expect(nearestIndex([1, 5, 10], 3)).toBe(0);
    expect(nearestIndex([1, 5, 10], 9)).toBe(2);
    expect(nearestIndex([1, 5, 10], 99)).toBe(2);
  });

  it('finds the nearest point, the newest of equals', () => {
    expect(nearestPoint([], 1)).toBeNull();
    const points = [
      { x: 1, y: 10 },
      { x: 4, y: 40 },
      { x: 1, y: 11 },
    ];
    expect(nearestPoint(points, 0)).toEqual({ x: 1, y: 11 });
    expect(nearestPoint(points, 3)).toEqual({ x: 4, y: 40 });
  });

  it("lists every run's value at the nearest step", () => {
    const a: Line = { run: 0, label: 'ns/a', points: [{ x: 1, y: 1 }, { x: 2, y: 2 }, { x: 3, y: 3 }] };
    const b: Line = { run: 1, label: 'ns/b', points: [{ x: 2, y: 20 }, { x: 4, y: 40 }] };
    const empty: Line = { run: 2, label: 'ns/c', points: [] };
    expect(steps([a, b, empty])).toEqual([1, 2, 3, 4]);
    expect(valuesAt([a, b, empty], 2).map(({ line, point }) => [line.label, point])).toEqual([
      ['ns/a', { x: 2, y: 2 }],
      ['ns/b', { x: 2, y: 20 }],
    ]);
    // A run without the step shows its nearest point (with its own step).
    expect(valuesAt([a, b], 4).map(({ point }) => point)).toEqual([{ x: 3, y: 3 }, { x: 4, y: 40 }]);
  });
});

describe('several runs', () => {
  it('overlays the series of runs, one chart per name with a line per run', () => {
    const reward = (points: number[]): Series => ({ type: 'reward', points: points.map((y, x) => ({ x, y })) });
    const loss: Series = { type: 'metrics.loss', points: [{ x: 0, y: 0.5 }] };
    const charts = overlay([
      { label: 'ns/a', series: [reward([1, 2])] },
      { label: 'ns/b', series: [loss, reward([3])] },
      { label: 'ns/c', series: [{ type: 'metrics.kl', points: [] }] },
    ]);
    expect(charts.map((c) => [c.name, c.lines.map((l) => [l.run, l.label, l.points.length])])).toEqual([
      ['reward', [[0, 'ns/a', 2], [1, 'ns/b', 1]]],
      ['metrics.loss', [[1, 'ns/b', 1]]],
    ]);
    expect(overlay([])).toEqual([]);
  });

  it('reads and writes the compare route', () => {
    const runs = [
      { namespace: 'default', name: 'job-a-main' },
      { namespace: 'team', name: 'job-b-main' },
    ];
    const href = compareHref(runs);
    expect(href).toBe('#/compare?tasks=default/job-a-main,team/job-b-main');
    expect(parseRuns(new URLSearchParams(href.split('?')[1]).get('tasks'))).toEqual(runs);
    expect(parseRuns('a/b,,nons,/x,y/,a/b,c/d/e, d/e ')).toEqual([
      { namespace: 'a', name: 'b' },
      { namespace: 'd', name: 'e' },
    ]);
    expect(parseRuns(null)).toEqual([]);
    expect(runKey(runs[1])).toBe('team/job-b-main');
  });
});
