import { cleanup, fireEvent, render, waitFor } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Compare } from './Compare';
import { Tasks } from './Tasks';

const task = (namespace: string, name: string) => ({
  metadata: { name, namespace, resourceVersion: '5', creationTimestamp: '2025-01-01T00:00:00Z' },
  spec: {},
  status: { phase: 'Running' },
});
const TASKS = [task('default', 'job-a-main'), task('default', 'job-b-main'), task('team', 'job-c-main')];

const reward = (seq: number, step: number, value: number) => JSON.stringify({ spec: { seq, report: { type: 'reward', step, value } } }) + '\n';

/** fetch answering the task list, watches that stay open, and each task's reports (its
 * rewards, then the stream stays open). */
function fakeFetch(reports: Record<string, string[]>) {
  return vi.fn(async (url: string) => {
    const u = String(url);
    const stream = (lines: string[]) =>
      new Response(
        new ReadableStream({
          start(c) {
            for (const l of lines) c.enqueue(new TextEncoder().encode(l));
          },
        }),
        { status: 200 },
      );
    const m = u.match(/\/namespaces\/([^/]+)\/tasks\/([^/]+)\/reports\?follow=true$/);
    if (m) return stream(reports[`${m[1]}/${m[2]}`] ?? []);
    if (u.includes('watch=1')) return stream([]);
    return new Response(JSON.stringify({ items: TASKS, metadata: { resourceVersion: '5' } }), { status: 200 });
  });
}

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
  window.location.hash = '';
});

describe('Compare', () => {
  it('overlays the runs: a chart per series with a line per run and a legend', async () => {
    const fetch = fakeFetch({
      'default/job-a-main': [reward(1, 1, 1), reward(2, 2, 2), JSON.stringify({ spec: { seq: 3, report: { type: 'metrics', step: 2, loss: 0.5 } } }) + '\n'],
      'default/job-b-main': [reward(1, 1, 3), reward(2, 2, 4), reward(3, 3, 5)],
    });
    vi.stubGlobal('fetch', fetch);
    const runs = [
      { namespace: 'default', name: 'job-a-main' },
      { namespace: 'default', name: 'job-b-main' },
    ];
    const { container, findByRole, getByRole, rerender } = render(<Compare runs={runs} />);
    await waitFor(() => expect(container.querySelectorAll('figure[data-series="reward"] polyline')).toHaveLength(2), { timeout: 3000 });
    const rewardChart = container.querySelector('figure[data-series="reward"]')!;
    expect([...rewardChart.querySelectorAll('polyline')].map((p) => p.getAttribute('data-run'))).toEqual(['default/job-a-main', 'default/job-b-main']);
    expect([...(await findByRole('list', { name: 'Runs in reward' })).querySelectorAll('li')].map((li) => li.textContent)).toEqual(['default/job-a-main', 'default/job-b-main']);
    // Only run a reports a loss: its chart has its line alone, in run a's colour.
    const loss = container.querySelector('figure[data-series="metrics.loss"]')!;
    expect([...loss.querySelectorAll('polyline')].map((p) => p.getAttribute('class'))).toEqual(['chart-line run-0']);
    expect(fetch.mock.calls.map(([u]) => String(u)).filter((u) => u.includes('/reports'))).toEqual([
      '/rlark/v1/namespaces/default/tasks/job-a-main/reports?follow=true',
      '/rlark/v1/namespaces/default/tasks/job-b-main/reports?follow=true',
    ]);
    // Removing a run, and adding one by its name, change the route.
    fireEvent.click(getByRole('button', { name: 'Remove default/job-a-main from the comparison' }));
    expect(window.location.hash).toBe('#/compare?tasks=default/job-b-main');
    fireEvent.input(getByRole('combobox', { name: 'Add a run (namespace/task)' }), { target: { value: 'job-b-main' } });
    fireEvent.click(getByRole('button', { name: 'Add run' }));
    expect((await findByRole('alert')).textContent).toBe('job-b-main is already compared.');
    fireEvent.input(getByRole('combobox', { name: 'Add a run (namespace/task)' }), { target: { value: 'nope' } });
    fireEvent.click(getByRole('button', { name: 'Add run' }));
    expect((await findByRole('alert')).textContent).toBe('No task nope.');
    fireEvent.input(getByRole('combobox', { name: 'Add a run (namespace/task)' }), { target: { value: 'job-c-main' } });
    fireEvent.click(getByRole('button', { name: 'Add run' }));
    expect(window.location.hash).toBe('#/compare?tasks=default/job-a-main,default/job-b-main,team/job-c-main');
    // The route's new runs: b keeps its stream (and its line), a's ends, c's starts.
    rerender(<Compare runs={[runs[1], { namespace: 'team', name: 'job-c-main' }]} />);
    expect([...container.querySelectorAll('figure[data-series="reward"] polyline')].map((p) => p.getAttribute('data-run'))).toEqual(['default/job-b-main']);
    await waitFor(() => expect(getByRole('row', { name: /team\/job-c-main/ })).toBeTruthy());
    expect(fetch.mock.calls.map(([u]) => String(u)).filter((u) => u.includes('/reports'))).toEqual([
      '/rlark/v1/namespaces/default/tasks/job-a-main/reports?follow=true',
      '/rlark/v1/namespaces/default/tasks/job-b-main/reports?follow=true',
      '/rlark/v1/namespaces/team/tasks/job-c-main/reports?follow=true',
    ]);
  });
});

describe('Tasks', () => {
  it('compares the ticked tasks', async () => {
    vi.stubGlobal('fetch', fakeFetch({}));
    const { findByRole, getByRole } = render(<Tasks />);
    const compare = getByRole('button', { name: 'Compare rewards' }) as HTMLButtonElement;
    expect(compare.disabled).toBe(true);
    fireEvent.click(await findByRole('checkbox', { name: 'Compare team/job-c-main' }));
    expect(compare.disabled).toBe(true);
    fireEvent.click(getByRole('checkbox', { name: 'Compare default/job-a-main' }));
    expect(compare.disabled).toBe(false);
    fireEvent.click(compare);
    expect(window.location.hash).toBe('#/compare?tasks=team/job-c-main,default/job-a-main');
  });
});
