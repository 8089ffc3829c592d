import { describe, expect, it } from 'vitest';
import { layoutDag } from './dag';

describe('layoutDag', () => {
  it('puts each template after its longest dependency chain', () => {
    const layout = layoutDag([
      { name: 'report', dependencies: ['eval-a', 'eval-b'] },
      { name: 'eval-a', dependencies: ['train'] },
      { name: 'eval-b', dependencies: ['train'] },
      { name: 'train', dependencies: [] },
    ]);
    const at = Object.fromEntries(layout.nodes.map((n) => [n.name, [n.column, n.row]]));
    expect(at).toEqual({ report: [2, 0], 'eval-a': [1, 0], 'eval-b': [1, 1], train: [0, 0] });
    expect(layout.columns).toBe(3);
    expect(layout.rows).toBe(2);
    expect(layout.edges).toContainEqual({ from: 'train', to: 'eval-a' });
    expect(layout.edges).toHaveLength(4);
    expect(layout.problems).toEqual([]);
  });

  it('reports cycles and unknown dependencies instead of looping', () => {
    const layout = layoutDag([
      { name: 'a', dependencies: ['b'] },
      { name: 'b', dependencies: ['a', 'ghost'] },
    ]);
    expect(layout.problems.some((p) => p.includes('cycle'))).toBe(true);
    expect(layout.problems).toContain('b depends on unknown template ghost');
  });
});
