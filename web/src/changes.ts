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

/** Follows `resources`, calling `read` with the lists to read again (bursts within 50 ms
 * become one call). Returns a stop function. */
export function followChanges(resources: ListName[], read: (lists: Set<ListName>) => void, onError: (message: string | null) => void = () => {}): () => void {
  const controller = new AbortController();
  let pending = new Set<ListName>();
  let flush: ReturnType<typeof setTimeout> | undefined;
  let retry: ReturnType<typeof setTimeout> | undefined;
  let attempt = 0;
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
  const run = async () => {
    try {
      const response = await request(`/rlark/v1/console/changes?resources=${resources.join(',')}`, { signal: controller.signal });
      for await (const line of lines(response.body!, controller.signal)) {
        if (!line.trim()) continue;
        const event = JSON.parse(line);
        if (event.type === 'BOOKMARK') {
          attempt = 0;
          onError(null);
          tell(resources);
        } else if (event.type === 'CHANGED' && resources.includes(event.resource)) tell([event.resource]);
        else if (event.type === 'ERROR') onError(event.message);
      }
    } catch (e) {
      if (controller.signal.aborted) return;
      onError(`live updates stopped: ${e instanceof Error ? e.message : String(e)}; reconnecting`);
    }
    if (!controller.signal.aborted) retry = setTimeout(run, backoff(attempt++));
  };
  run();
  return () => {
    controller.abort();
    clearTimeout(flush);
    clearTimeout(retry);
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
