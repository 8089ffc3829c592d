import { useEffect, useRef, useState } from 'preact/hooks';
import { ApiError, request } from '../api';
import { lines } from '../watch';

/** At most this many lines are kept in the page. */
const MAX_LINES = 5000;

/** A replica's log, streamed from `/rlark/v1/namespaces/NS/pods/POD/log` (follow). */
export function Logs({ namespace, pod }: { namespace: string; pod: string }) {
  const [follow, setFollow] = useState(true);
  const [text, setText] = useState<string[]>([]);
  const [status, setStatus] = useState<string>('');
  const box = useRef<HTMLPreElement>(null);

  useEffect(() => {
    const controller = new AbortController();
    setText([]);
    setStatus(follow ? 'following' : 'loading');
    (async () => {
      try {
        const q = new URLSearchParams({ tailLines: '1000' });
        if (follow) q.set('follow', 'true');
        const response = await request(`/rlark/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(pod)}/log?${q}`, {
          signal: controller.signal,
        });
        let pending: string[] = [];
        let timer: ReturnType<typeof setTimeout> | null = null;
        const flush = () => {
          timer = null;
          const add = pending;
          pending = [];
          setText((old) => {
            const next = old.concat(add);
            return next.length > MAX_LINES ? next.slice(next.length - MAX_LINES) : next;
          });
        };
        for await (const line of lines(response.body!, controller.signal)) {
          pending.push(line);
          if (!timer) timer = setTimeout(flush, 50);
        }
        if (timer) clearTimeout(timer);
        flush();
        setStatus(follow ? 'log ended (the replica exited)' : '');
      } catch (e) {
        if (!controller.signal.aborted) setStatus(e instanceof ApiError ? `error: ${e.message}` : `error: ${String(e)}`);
      }
    })();
    return () => controller.abort();
  }, [namespace, pod, follow]);

  useEffect(() => {
    if (follow && box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [text, follow]);

  return (
    <div class="logs">
      <div class="logs-bar">
        <label>
          <input type="checkbox" checked={follow} onChange={(e) => setFollow((e.target as HTMLInputElement).checked)} /> Follow
        </label>
        <span class="muted" role="status">
          {status}
        </span>
      </div>
      <pre ref={box} class="log" tabIndex={0} aria-label={`Log of ${pod}`} data-testid="log">
        {text.join('\n')}
      </pre>
    </div>
  );
}
