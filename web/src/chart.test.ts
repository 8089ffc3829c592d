import { describe, expect, it } from 'vitest';
import { addReport, polyline, Series } from './chart';

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
    const { path, min, max } = polyline(
      [
        { x: 0, y: 0 },
        { x: 10, y: 5 },
      ],
      100,
      50,
    );
    expect(path).toBe('0.0,50.0 100.0,0.0');
    expect([min, max]).toEqual([0, 5]);
    expect(polyline([{ x: 1, y: 1 }], 100, 50).path).toBe('50.0,25.0');
  });
});
