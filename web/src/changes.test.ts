import { afterEach, describe, expect, it, vi } from 'vitest';
import { followChanges, ListName } from './changes';

/** A response streaming `text` and then, unless `open`, ending. */
function ndjson(parts: string[], open = false) {
  return new Response(
    new ReadableStream({
      start(c) {
        for (const p of parts) c.enqueue(new TextEncoder().encode(p));
        if (!open) c.close();
      },
    }),
    { status: 200, headers: { 'Content-Type': 'application/x-ndjson' } },
  );
}

afterEach(() => vi.unstubAllGlobals());

describe('followChanges', () => {
  it('reads every list after the bookmark, then the changed ones, batched', async () => {
    const fetch = vi.fn(async () =>
      ndjson(['{"type":"BOOKMARK","revision":"4"}\n', '{"type":"CHANGED","resource":"tokens","revision":"5"}\n{"type":"CHANGED","resource":"tok', 'ens","revision":"6"}\n'], true),
    );
    vi.stubGlobal('fetch', fetch);
    const reads: ListName[][] = [];
    const stop = followChanges(['tokens', 'certificates'], (l) => reads.push([...l].sort()));
    await vi.waitFor(() => expect(reads.length).toBeGreaterThan(0));
    // The bookmark and the changes right after it fall in one 50 ms batch.
    expect(reads[0]).toEqual(['certificates', 'tokens']);
    expect((fetch.mock.calls[0] as unknown[])[0]).toBe('/rlark/v1/console/changes?resources=tokens,certificates');
    stop();
  });

  it('opens the stream again when it ends and reads every list again', async () => {
    let n = 0;
    const fetch = vi.fn(async () => {
      n += 1;
      if (n === 1) return ndjson(['{"type":"BOOKMARK","revision":"4"}\n', '{"type":"ERROR","message":"the change log no longer covers this watch"}\n']);
      return ndjson(['{"type":"BOOKMARK","revision":"9"}\n'], true);
    });
    vi.stubGlobal('fetch', fetch);
    const reads: ListName[][] = [];
    const errors: (string | null)[] = [];
    const stop = followChanges(['sshkeys'], (l) => reads.push([...l]), (e) => errors.push(e));
    await vi.waitFor(() => expect(reads.length).toBe(2), { timeout: 3000 });
    expect(errors).toEqual([null, 'the change log no longer covers this watch', 'live updates stopped: the stream ended; reconnecting', null]);
    expect(fetch).toHaveBeenCalledTimes(2);
    stop();
  });
});
