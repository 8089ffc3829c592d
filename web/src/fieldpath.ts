// Where a field of a YAML manifest is written: maps a Kubernetes field path from a
// `Status` cause (`spec.tasks[0].raw.replicas`) to the line of the YAML that sets it.
import { isMap, isSeq, LineCounter, parseDocument } from 'yaml';

/** `spec.tasks[0].raw.replicas` → ['spec', 'tasks', 0, 'raw', 'replicas']. */
export function parseFieldPath(path: string): (string | number)[] {
  const out: (string | number)[] = [];
  const re = /([^.[\]]+)|\[(\d+)\]|\[([^\]]*)\]/g;
  let m: RegExpExecArray | null;
  while ((m = re.exec(path))) {
    if (m[1] !== undefined) out.push(m[1]);
    else if (m[2] !== undefined) out.push(Number(m[2]));
    else out.push(m[3]);
  }
  return out;
}

/**
 * The 1-based line of the deepest node on `path` present in `source` (a field the API
 * says is missing is reported at its parent), or null if not even the first key is.
 */
export function lineOfField(source: string, path: string): number | null {
  const counter = new LineCounter();
  const doc = parseDocument(source, { lineCounter: counter, keepSourceTokens: true });
  let node: any = doc.contents;
  let line: number | null = null;
  for (const key of parseFieldPath(path)) {
    if (isMap(node)) {
      const pair: any = node.items.find((p: any) => (p.key?.value ?? p.key) === key);
      if (!pair) break;
      const at = pair.key?.range?.[0] ?? pair.value?.range?.[0];
      if (at !== undefined) line = counter.linePos(at).line;
      node = pair.value;
    } else if (isSeq(node) && typeof key === 'number') {
      const item: any = node.items[key];
      if (!item) break;
      if (item.range) line = counter.linePos(item.range[0]).line;
      node = item;
    } else {
      break;
    }
  }
  return line;
}

export interface ParsedManifest {
  value: any;
  errors: { line: number; message: string }[];
}

/** Parse one YAML document, with syntax errors at their lines. */
export function parseManifest(source: string): ParsedManifest {
  const counter = new LineCounter();
  const doc = parseDocument(source, { lineCounter: counter, prettyErrors: false });
  const errors = doc.errors.map((e) => ({ line: e.linePos?.[0]?.line ?? counter.linePos(e.pos[0]).line, message: e.message.split('\n')[0] }));
  return { value: errors.length ? null : doc.toJS(), errors };
}
