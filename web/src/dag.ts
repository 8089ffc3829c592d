// Layout of a Workflow's DAG: each job template in the column of its longest chain of
// dependencies, rows in template order within a column.

export interface DagNode {
  name: string;
  dependencies: string[];
}

export interface PlacedNode extends DagNode {
  column: number;
  row: number;
}

export interface DagLayout {
  nodes: PlacedNode[];
  edges: { from: string; to: string }[];
  columns: number;
  rows: number;
  /** Templates on a cycle or depending on an unknown template (the API refuses both). */
  problems: string[];
}

export function layoutDag(templates: DagNode[]): DagLayout {
  const byName = new Map(templates.map((t) => [t.name, t]));
  const depth = new Map<string, number>();
  const problems: string[] = [];
  const visiting = new Set<string>();
  const depthOf = (name: string): number => {
    const known = depth.get(name);
    if (known !== undefined) return known;
    if (visiting.has(name)) {
      problems.push(`${name} is on a dependency cycle`);
      return 0;
    }
    visiting.add(name);
    const t = byName.get(name)!;
    let d = 0;
    for (const dep of t.dependencies) {
      if (!byName.has(dep)) {
        problems.push(`${name} depends on unknown template ${dep}`);
        continue;
      }
      d = Math.max(d, depthOf(dep) + 1);
    }
    visiting.delete(name);
    depth.set(name, d);
    return d;
  };
  templates.forEach((t) => depthOf(t.name));
  const rowsInColumn = new Map<number, number>();
  const nodes = templates.map((t) => {
    const column = depth.get(t.name) ?? 0;
    const row = rowsInColumn.get(column) ?? 0;
    rowsInColumn.set(column, row + 1);
    return { ...t, column, row };
  });
  const edges = templates.flatMap((t) => t.dependencies.filter((d) => byName.has(d)).map((d) => ({ from: d, to: t.name })));
  return {
    nodes,
    edges,
    columns: Math.max(0, ...nodes.map((n) => n.column + 1)),
    rows: Math.max(0, ...rowsInColumn.values()),
    problems,
  };
}
