import { afterEach, describe, expect, it, vi } from 'vitest';
import { ListWatch, PAGE_SIZE, WatchState } from './watch';
import { KubeObject } from './api';

const task = (i: number, rv = 1): KubeObject => ({ metadata: { name: `t-${i}`, namespace: 'rlark-a', resourceVersion: String(rv) }, status: { phase: 'Running' } });

afterEach(() => vi.unstubAllGlobals());

describe('ListWatch', () => {
  it('reads 10,000 Tasks in pages, then follows the watch from the list revision', async () => {
    const total = 10_000;
    const urls: string[] = [];
    let push: ((line: string) => void) | null = null;
    vi.stubGlobal(
      'fetch',
      vi.fn(async (url: string) => {
        urls.push(url);
        const q = new URL(url, 'https://x').searchParams;
        if (q.get('watch') === '1') {
          const encoder = new TextEncoder();
          const body = new ReadableStream<Uint8Array>({
            start(controller) {
              push = (line) => controller.enqueue(encoder.encode(line + '\n'));
            },
          });
          return new Response(body, { status: 200 });
        }
        const start = Number(q.get('continue') ?? 0);
        const limit = Number(q.get('limit'));
        const items = Array.from({ length: Math.min(limit, total - start) }, (_, i) => task(start + i));
        const next = start + items.length;
        return new Response(JSON.stringify({ items, metadata: { resourceVersion: '77', continue: next < total ? String(next) : undefined } }), { status: 200 });
      }),
    );
    const states: WatchState<KubeObject>[] = [];
    const watch = new ListWatch<KubeObject>('/apis/rlinf.io/v1alpha1/tasks', {}, (s) => states.push(s));
    watch.start();
    await vi.waitFor(() => expect(push).not.toBeNull());
    const lists = urls.filter((u) => !u.includes('watch=1'));
    expect(lists).toHaveLength(total / PAGE_SIZE);
    expect(lists.every((u) => u.includes(`limit=${PAGE_SIZE}`))).toBe(true);
    const watchUrl = urls.find((u) => u.includes('watch=1'))!;
    expect(watchUrl).toContain('resourceVersion=77');
    expect(states[states.length - 1].items).toHaveLength(total);

    // A burst of events is rendered once.
    const before = states.length;
    push!(JSON.stringify({ type: 'ADDED', object: task(total, 78) }));
    push!(JSON.stringify({ type: 'DELETED', object: task(0, 79) }));
    push!(JSON.stringify({ type: 'MODIFIED', object: { ...task(1, 80), status: { phase: 'Succeeded' } } }));
    await vi.waitFor(() => expect(states.length).toBe(before + 1));
    const items = states[states.length - 1].items;
    expect(items).toHaveLength(total);
    expect(items.find((t) => t.metadata.name === 't-0')).toBeUndefined();
    expect(items.find((t) => t.metadata.name === 't-1')!.status.phase).toBe('Succeeded');
    watch.stop();
  });
});
