import { useEffect, useRef, useState } from 'preact/hooks';
import { ApiError, request } from '../api';
import { addReport, overlay, RunRef, runKey, Series } from '../chart';
import { lines } from '../watch';
import { LineChart } from './LineChart';

export interface RunReports {
  series: Series[];
  status: string;
}

/** Follows one task's reports (`GET .../reports?follow=true`, NDJSON) until `signal` ends,
 * handing its series to `update` at most every 100 ms. The follow stream ends when the
 * server stops or falls behind: it is followed again from the start (the stream replays
 * what is stored). */
async function follow(run: RunRef, signal: AbortSignal, update: (change: Partial<RunReports>) => void) {
  const map = new Map<string, Series>();
  let failures = 0;
  while (!signal.aborted) {
    try {
      const response = await request(`/rlark/v1/namespaces/${encodeURIComponent(run.namespace)}/tasks/${encodeURIComponent(run.name)}/reports?follow=true`, { signal });
      map.clear();
      update({ status: 'following' });
      let timer: ReturnType<typeof setTimeout> | null = null;
      for await (const line of lines(response.body!, signal)) {
        if (!line.trim()) continue;
        if (addReport(map, JSON.parse(line)) && !timer) {
          timer = setTimeout(() => {
            timer = null;
            if (!signal.aborted) update({ series: [...map.values()].map((s) => ({ ...s, points: [...s.points] })) });
          }, 100);
        }
      }
      failures = 0;
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && e.status < 500) {
        update({ status: `error: ${e.message}` });
        return;
      }
      failures += 1;
      update({ status: `reconnecting (${(e as Error).message})` });
    }
    await new Promise((r) => setTimeout(r, Math.min(10_000, 500 * 2 ** failures)));
  }
}

/** The numeric reports of each of `runs`, followed live (in the order of `runs`). A run
 * added later gets its own stream; the others keep theirs (and what they have shown). */
export function useReports(runs: RunRef[]): RunReports[] {
  const key = runs.map(runKey).join(',');
  const [state, setState] = useState<Record<string, RunReports>>({});
  const streams = useRef(new Map<string, AbortController>());
  useEffect(() => {
    const wanted = new Set(runs.map(runKey));
    for (const [k, controller] of streams.current) {
      if (wanted.has(k)) continue;
      controller.abort();
      streams.current.delete(k);
      setState(({ [k]: _, ...rest }) => rest);
    }
    for (const run of runs) {
      const k = runKey(run);
      if (streams.current.has(k)) continue;
      const controller = new AbortController();
      streams.current.set(k, controller);
      follow(run, controller.signal, (change) => setState((s) => ({ ...s, [k]: { ...(s[k] ?? { series: [], status: '' }), ...change } })));
    }
  }, [key]);
  useEffect(
    () => () => {
      for (const controller of streams.current.values()) controller.abort();
      streams.current.clear();
    },
    [],
  );
  return runs.map((r) => state[runKey(r)] ?? { series: [], status: '' });
}

/** The task's reports with a numeric `value` (rewards, metrics), followed live. */
export function ReportChart({ namespace, task }: { namespace: string; task: string }) {
  const run = { namespace, name: task };
  const [{ series, status }] = useReports([run]);
  const charts = overlay([{ label: runKey(run), series }]);
  if (charts.length === 0) {
    return (
      <p class="muted" role="status">
        No numeric reports yet (a task posts them with the Python SDK's <code>rlark.report(step=..., reward=...)</code>). {status}
      </p>
    );
  }
  return (
    <div class="chart">
      {charts.map((c) => (
        <LineChart key={c.name} name={c.name} lines={c.lines} />
      ))}
    </div>
  );
}
