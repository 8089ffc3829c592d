// Pushes of "this list changed" for the records that are not Kubernetes resources (tokens,
// join tokens, certificates, revocations, SSH keys): `GET /rlark/v1/console/changes`
// (docs/api.md), newline-delimited JSON. The page reads a list again when told it changed,
// and every list once the stream (re)starts (its BOOKMARK line), so nothing changed while
// it was down is missed. A stream that ends is opened again after 1 s, doubling to 10 s.
// No polling.
import { useEffect, useRef } from 'preact/hooks';
import { request } from './api';
import { backoff } from './mjpeg';
import { lines } from './watch';

export type ListName = 'tokens' | 'jointokens' | 'certificates' | 'revocations' | 'sshkeys';

/** Follows a stream of JSON lines at `path`: `onLine` for each; when it ends or fails,
 * `onDown` with the reason and it is opened again after 1 s, doubling to 10 s (back to 1 s
 * once a line arrives). Returns a stop function. */
export function followLines(path: string, onLine: (value: any) => void, onDown: (reason: string) => void): () => void {
  const controller = new AbortController();
  let retry: ReturnType<typeof setTimeout> | undefined;
  let attempt = 0;
  const run = async () => {
    try {
      const response = await request(path, { signal: controller.signal });
      for await (const line of lines(response.body!, controller.signal)) {
        if (!line.trim()) continue;
        attempt = 0;
        onLine(JSON.parse(line));
      }
      if (!controller.signal.aborted) onDown('the stream ended');
    } catch (e) {
      if (controller.signal.aborted) return;
      onDown(e instanceof Error ? e.message : String(e));
    }
    if (!controller.signal.aborted) retry = setTimeout(run, backoff(attempt++));
  };
  run();
  return () => {
    controller.abort();
    clearTimeout(retry);
  };
}

/** Follows `resources`, calling `read` with the lists to read again (bursts within 50 ms
 * become one call). Returns a stop function. */
export function followChanges(resources: ListName[], read: (lists: Set<ListName>) => void, onError: (message: string | null) => void = () => {}): () => void {
  let pending = new Set<ListName>();
  let flush: ReturnType<typeof setTimeout> | undefined;
  const tell = (lists: Iterable<ListName>) => {
    for (const l of lists) pending.add(l);
    if (flush) return;
    flush = setTimeout(() => {
      flush = undefined;
      const due = pending;
      pending = new Set();
      read(due);
    }, 50);
  };
  const stop = followLines(
    `/rlark/v1/console/changes?resources=${resources.join(',')}`,
    (event) => {
      if (event.type === 'BOOKMARK') {
        onError(null);
        tell(resources);
      } else if (event.type === 'CHANGED' && resources.includes(event.resource)) tell([event.resource]);
      else if (event.type === 'ERROR') onError(event.message);
    },
    (reason) => onError(`live updates stopped: ${reason}; reconnecting`),
  );
  return () => {
    stop();
    clearTimeout(flush);
  };
}

/** `followChanges` for the life of a component; `read` may change between renders. */
export function useChanges(resources: ListName[], read: (lists: Set<ListName>) => void, onError?: (message: string | null) => void) {
  const latest = useRef({ read, onError });
  latest.current = { read, onError };
  useEffect(
    () =>
      followChanges(
        resources,
        (lists) => latest.current.read(lists),
        (m) => latest.current.onError?.(m),
      ),
    [resources.join(',')],
  );
}
