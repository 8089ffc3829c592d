// Several runs (Tasks) overlaid: each series (`reward`, `metrics.loss`, ...) one chart with
// a line per run. The runs live in the route (`#/compare?tasks=ns/a,ns/b`), so the view
// can be shared; adding or removing a run changes the route.
import { useState } from 'preact/hooks';
import { RLINF } from '../api';
import { compareHref, overlay, RunRef, runKey } from '../chart';
import { ErrorBanner, Phase, Section } from '../components/common';
import { LineChart, runClass } from '../components/LineChart';
import { useReports } from '../components/ReportChart';
import { href } from '../router';
import { useWatch } from '../watch';

const show = (runs: RunRef[]) => {
  window.location.hash = compareHref(runs).slice(1);
};

export function Compare({ runs }: { runs: RunRef[] }) {
  const tasks = useWatch(`${RLINF}/tasks`);
  const reports = useReports(runs);
  const [adding, setAdding] = useState('');
  const [addError, setAddError] = useState<string | null>(null);
  const chosen = new Set(runs.map(runKey));
  const taskOf = (run: RunRef) => tasks.items.find((t) => (t.metadata.namespace ?? 'default') === run.namespace && t.metadata.name === run.name);
  const candidates = tasks.items.map((t) => `${t.metadata.namespace ?? 'default'}/${t.metadata.name}`).filter((k) => !chosen.has(k)).sort();
  const charts = overlay(runs.map((run, i) => ({ label: runKey(run), series: reports[i].series })));

  const add = (e: Event) => {
    e.preventDefault();
    const key = adding.trim();
    if (!key) return;
    const [namespace, name] = key.includes('/') ? [key.slice(0, key.indexOf('/')), key.slice(key.indexOf('/') + 1)] : ['', key];
    // A bare name is enough when one namespace has a task of that name.
    const matches = tasks.items.filter((t) => t.metadata.name === name && (!namespace || (t.metadata.namespace ?? 'default') === namespace));
    if (chosen.has(key) || (matches.length === 1 && chosen.has(`${matches[0].metadata.namespace ?? 'default'}/${name}`))) {
      setAddError(`${key} is already compared.`);
      return;
    }
    if (matches.length !== 1) {
      setAddError(matches.length === 0 ? `No task ${key}.` : `Tasks named ${name} are in several namespaces: give namespace/${name}.`);
      return;
    }
    setAddError(null);
    setAdding('');
    show([...runs, { namespace: matches[0].metadata.namespace ?? 'default', name }]);
  };

  return (
    <main>
      <h1>Compare runs</h1>
      <ErrorBanner error={tasks.error} />
      <Section title="Runs">
        {runs.length === 0 ? <p class="muted">No runs chosen: add tasks below, or tick them on the Tasks page and press "Compare rewards".</p> : null}
        {runs.length > 0 ? (
          <table aria-label="Runs">
            <thead>
              <tr>
                <th scope="col">Run</th>
                <th scope="col">Phase</th>
                <th scope="col">Reports</th>
                <th scope="col">Actions</th>
              </tr>
            </thead>
            <tbody>
              {runs.map((run, i) => {
                const key = runKey(run);
                const task = taskOf(run);
                const points = reports[i].series.reduce((n, s) => n + s.points.length, 0);
                return (
                  <tr key={key} data-run={key}>
                    <td>
                      <svg class="swatch" width="18" height="10" aria-hidden="true">
                        <line x1="1" y1="5" x2="17" y2="5" class={`chart-line ${runClass(i)}`} />
                      </svg>
                      <a href={href('tasks', run.namespace, run.name)}>{key}</a>
                    </td>
                    <td>{task ? <Phase phase={task.status?.phase} /> : tasks.loaded ? 'no such task' : ''}</td>
                    <td>
                      {points} values{reports[i].status && reports[i].status !== 'following' ? ` (${reports[i].status})` : ''}
                    </td>
                    <td>
                      <button type="button" onClick={() => show(runs.filter((r) => runKey(r) !== key))} aria-label={`Remove ${key} from the comparison`}>
                        Remove
                      </button>
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        ) : null}
        <form class="inline-form" onSubmit={add}>
          <label>
            Add a run (namespace/task){' '}
            <input list="compare-candidates" size={40} value={adding} onInput={(e) => setAdding((e.target as HTMLInputElement).value)} aria-invalid={addError ? 'true' : undefined} />
          </label>
          <datalist id="compare-candidates">
            {candidates.map((k) => (
              <option key={k} value={k} />
            ))}
          </datalist>
          <button type="submit">Add run</button>
          {addError ? (
            <span class="error" role="alert">
              {addError}
            </span>
          ) : null}
        </form>
      </Section>
      <Section title="Rewards and metrics">
        {charts.length === 0 ? (
          <p class="muted" role="status">
            {runs.length === 0 ? 'Nothing to chart yet.' : 'No numeric reports from these runs yet.'}
          </p>
        ) : (
          <div class="chart">
            {charts.map((c) => (
              <LineChart key={c.name} name={c.name} lines={c.lines} legend />
            ))}
          </div>
        )}
      </Section>
    </main>
  );
}
