import { describe, expect, it } from 'vitest';
import { lineOfField, parseFieldPath, parseManifest } from './fieldpath';

const JOB = `apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: demo
spec:
  tasks:
    - name: main
      agentType: Raw
      raw:
        entrypoint: ["true"]
        replicas: -1
    - name: second
      role: Nope
`;

describe('field paths', () => {
  it('parse indices and keys', () => {
    expect(parseFieldPath('spec.tasks[0].raw.replicas')).toEqual(['spec', 'tasks', 0, 'raw', 'replicas']);
    expect(parseFieldPath('metadata.labels[rlark.io/x]')).toEqual(['metadata', 'labels', 'rlark.io/x']);
  });

  it('find the line that sets a field', () => {
    expect(lineOfField(JOB, 'spec.tasks[0].raw.replicas')).toBe(11);
    expect(lineOfField(JOB, 'spec.tasks[1].role')).toBe(13);
    expect(lineOfField(JOB, 'metadata.name')).toBe(4);
  });

  it('report a missing field at its deepest present parent', () => {
    expect(lineOfField(JOB, 'spec.tasks[1].raw')).toBe(12);
    expect(lineOfField(JOB, 'status.phase')).toBeNull();
  });

  it('report YAML syntax errors with their line', () => {
    const parsed = parseManifest('kind: Job\nspec:\n  tasks: [\n');
    expect(parsed.value).toBeNull();
    expect(parsed.errors.length).toBeGreaterThan(0);
    expect(parsed.errors[0].line).toBeGreaterThanOrEqual(3);
    expect(parseManifest(JOB).value.spec.tasks[0].raw.replicas).toBe(-1);
  });
});
