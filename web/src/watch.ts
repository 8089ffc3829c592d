// List-then-watch, as Kubernetes informers do: read the collection in pages (`limit` and
// `continue`), then follow `?watch=1&resourceVersion=RV` as a stream of JSON lines. When the
// watch ends (server timeout, network) it is re-opened from the last resourceVersion seen;
// a 410 Gone (too old) starts over with a fresh list. No polling.
import { useEffect, useState } from 'preact/hooks';
import { ApiError, KubeObject, keyOf, request, toApiError } from './api';

export const PAGE_SIZE = 500;

export interface WatchState<T extends KubeObject> {
  items: T[];
  loaded: boolean;
  error: string | null;
}

export interface Selectors {
  labelSelector?: string;
  fieldSelector?: string;
}

function query(params: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : '';
}

/** Split a stream of bytes into lines. */
export async function* lines(body: ReadableStream<Uint8Array>, signal: AbortSignal): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        yield line;
      }
    }
    if (buffer) yield buffer;
  } finally {
    reader.cancel().catch(() => undefined);
  }
}

export class ListWatch<T extends KubeObject> {
  private objects = new Map<string, T>();
  private controller = new AbortController();
  private flushTimer: ReturnType<typeof setTimeout> | null = null;
  state: WatchState<T> = { items: [], loaded: false, error: null };

  constructor(
    private path: string,
    private selectors: Selectors,
    private onChange: (state: WatchState<T>) => void,
  ) {}

  start() {
    this.run().catch((e) => {
      if (!this.controller.signal.aborted) this.publish(String(e?.message ?? e));
    });
  }

  stop() {
    this.controller.abort();
    if (this.flushTimer) clearTimeout(this.flushTimer);
  }

  private publish(error: string | null = null) {
    const items = [...this.objects.values()];
    this.state = { items, loaded: true, error };
    this.onChange(this.state);
  }

  /** Batch bursts of events into one render (a 10,000-Task list sees many at once). */
  private schedule() {
    if (this.flushTimer) return;
    this.flushTimer = setTimeout(() => {
      this.flushTimer = null;
      this.publish();
    }, 50);
  }

  private async list(): Promise<string> {
    const signal = this.controller.signal;
    this.objects.clear();
    let cont: string | undefined;
    let rv = '';
    do {
      const response = await request(this.path + query({ ...this.selectors, limit: String(PAGE_SIZE), continue: cont }), { signal });
      const list = await response.json();
      for (const item of list.items ?? []) {
        // List items omit kind/apiVersion: keep what the list says.
        this.objects.set(keyOf(item), item);
      }
      cont = list.metadata?.continue || undefined;
      rv = list.metadata?.resourceVersion ?? rv;
      if (cont) this.publish();
    } while (cont && !signal.aborted);
    this.publish();
    return rv;
  }

  private async run() {
    const signal = this.controller.signal;
    let rv = await this.list();
    let failures = 0;
    while (!signal.aborted) {
      try {
        const response = await fetch(
          this.path + query({ ...this.selectors, watch: '1', resourceVersion: rv, allowWatchBookmarks: 'true' }),
          { credentials: 'same-origin', signal, headers: { Accept: 'application/json' } },
        );
        if (!response.ok || !response.body) throw await toApiError(response);
        failures = 0;
        for await (const line of lines(response.body, signal)) {
          if (!line.trim()) continue;
          const event = JSON.parse(line);
          if (event.type === 'ERROR') {
            if (event.object?.code === 410) throw new ApiError(410, 'watch expired');
            throw new ApiError(event.object?.code ?? 500, event.object?.message ?? 'watch error');
          }
          const object: T = event.object;
          rv = object.metadata?.resourceVersion ?? rv;
          if (event.type === 'BOOKMARK') continue;
          if (event.type === 'DELETED') this.objects.delete(keyOf(object));
          else this.objects.set(keyOf(object), object);
          this.schedule();
        }
      } catch (e) {
        if (signal.aborted) return;
        if (e instanceof ApiError && e.status === 410) {
          rv = await this.list();
          continue;
        }
        if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
          this.publish(e.message);
          return;
        }
        failures += 1;
        this.publish(`watch interrupted (${(e as Error).message}); reconnecting`);
        // Back off before re-opening the watch: 0.5 s doubling to 10 s.
        await new Promise((r) => setTimeout(r, Math.min(10_000, 500 * 2 ** failures)));
      }
    }
  }
}

/** A live list of the collection at `path` (`null`: nothing to watch yet). */
export function useWatch<T extends KubeObject = KubeObject>(path: string | null, selectors: Selectors = {}): WatchState<T> {
  const [state, setState] = useState<WatchState<T>>({ items: [], loaded: false, error: null });
  const { labelSelector, fieldSelector } = selectors;
  useEffect(() => {
    if (!path) return;
    setState({ items: [], loaded: false, error: null });
    const watch = new ListWatch<T>(path, { labelSelector, fieldSelector }, setState);
    watch.start();
    return () => watch.stop();
  }, [path, labelSelector, fieldSelector]);
  return state;
}

/** One live object: a watch of its collection narrowed to its name. */
export function useWatchOne<T extends KubeObject = KubeObject>(collection: string | null, name: string): { object: T | undefined; loaded: boolean; error: string | null } {
  const state = useWatch<T>(collection, { fieldSelector: `metadata.name=${name}` });
  return { object: state.items[0], loaded: state.loaded, error: state.error };
}
