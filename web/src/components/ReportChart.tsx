import { useEffect, useState } from 'preact/hooks';
import { ApiError, request } from '../api';
import { addReport, polyline, Series } from '../chart';
import { lines } from '../watch';

const W = 560;
const H = 160;
const COLORS = ['#0550ae', '#116329', '#a40e26', '#7d4e00', '#6639ba'];

/** The task's reports with a numeric `value` (rewards, metrics), followed live. */
export function ReportChart({ namespace, task }: { namespace: string; task: string }) {
  const [series, setSeries] = useState<Series[]>([]);
  const [status, setStatus] = useState('');

  useEffect(() => {
    const controller = new AbortController();
    const map = new Map<string, Series>();
    setSeries([]);
    (async () => {
      // The follow stream ends when the server stops or falls behind: follow again
      // from the start (the stream replays what is stored).
      let failures = 0;
      while (!controller.signal.aborted) {
        try {
          const response = await request(`/rlark/v1/namespaces/${encodeURIComponent(namespace)}/tasks/${encodeURIComponent(task)}/reports?follow=true`, {
            signal: controller.signal,
          });
          map.clear();
          setStatus('following');
          let timer: ReturnType<typeof setTimeout> | null = null;
          for await (const line of lines(response.body!, controller.signal)) {
            if (!line.trim()) continue;
            if (addReport(map, JSON.parse(line)) && !timer) {
              timer = setTimeout(() => {
                timer = null;
                setSeries([...map.values()].map((s) => ({ ...s, points: [...s.points] })));
              }, 100);
            }
          }
          failures = 0;
        } catch (e) {
          if (controller.signal.aborted) return;
          if (e instanceof ApiError && e.status < 500) {
            setStatus(`error: ${e.message}`);
            return;
          }
          failures += 1;
          setStatus(`reconnecting (${(e as Error).message})`);
        }
        await new Promise((r) => setTimeout(r, Math.min(10_000, 500 * 2 ** failures)));
      }
    })();
    return () => controller.abort();
  }, [namespace, task]);

  if (series.length === 0) {
    return (
      <p class="muted" role="status">
        No numeric reports yet (a task posts them with the Python SDK's <code>rlark.report(step=..., reward=...)</code>). {status}
      </p>
    );
  }
  return (
    <div class="chart">
      {series.map((s, i) => {
        const { path, min, max } = polyline(s.points, W, H);
        const last = s.points[s.points.length - 1];
        return (
          <figure key={s.type} data-series={s.type} data-points={s.points.length}>
            <figcaption>
              <strong>{s.type}</strong>: {s.points.length} points, last {last.y.toPrecision(4)} (min {min.toPrecision(4)}, max {max.toPrecision(4)})
            </figcaption>
            <svg width={W + 20} height={H + 20} viewBox={`-10 -10 ${W + 20} ${H + 20}`} role="img" aria-label={`${s.type} over ${s.points.length} reports, last value ${last.y}`}>
              <rect x="0" y="0" width={W} height={H} class="chart-frame" />
              <polyline points={path} fill="none" stroke={COLORS[i % COLORS.length]} stroke-width="2" />
            </svg>
          </figure>
        );
      })}
    </div>
  );
}
