import { lazy, Suspense } from 'preact/compat';
import { useState } from 'preact/hooks';
import { Session } from '../api';
import { resourcePath } from '../api';
import { Conditions, ErrorBanner, Phase, Section } from '../components/common';
import { Events } from '../components/Events';
import { Logs } from '../components/Logs';
import { ReportChart } from '../components/ReportChart';
import { href } from '../router';
import { useWatch, useWatchOne } from '../watch';

// xterm.js is loaded only when a terminal is opened.
const Terminal = lazy(() => import('../components/Terminal'));

export function TaskDetail({ namespace, name, session }: { namespace: string; name: string; session: Session }) {
  const { object: task, loaded, error } = useWatchOne(resourcePath('tasks', namespace), name);
  const pods = useWatch(resourcePath('pods', namespace), { labelSelector: `rlark.io/task-name=${name}` });
  const [selected, setSelected] = useState<string | null>(null);
  const [terminal, setTerminal] = useState<string | null>(null);
  const podItems = [...pods.items].sort((a, b) => (a.spec?.replicaIndex ?? 0) - (b.spec?.replicaIndex ?? 0));
  const shown = selected ?? podItems[0]?.metadata.name ?? null;
  if (!task) {
    return (
      <main>
        <h1>Task {name}</h1>
        <ErrorBanner error={error} />
        {loaded ? <p>Task {namespace}/{name} does not exist (or was deleted).</p> : <p>Loading…</p>}
      </main>
    );
  }
  const job = task.metadata.labels?.['rlinf.io/job'];
  return (
    <main>
      <h1>
        Task {name} <Phase phase={task.status?.phase} />
      </h1>
      <ErrorBanner error={error ?? pods.error} />
      <dl class="facts">
        <dt>Namespace</dt>
        <dd>{namespace}</dd>
        <dt>Job</dt>
        <dd>{job ? <a href={href('jobs', job)}>{job}</a> : '—'}</dd>
        <dt>Cluster</dt>
        <dd>{task.spec?.placement?.clusterID ?? 'not placed yet'}</dd>
        <dt>Replicas</dt>
        <dd>
          {task.status?.readyReplicas ?? 0} ready, {task.status?.succeededReplicas ?? 0} succeeded, {task.status?.failedReplicas ?? 0} failed of{' '}
          {task.status?.replicas ?? '?'}
        </dd>
        <dt>Message</dt>
        <dd>{task.status?.message ?? '—'}</dd>
      </dl>
      <Section title="Replicas">
        <table aria-label="Replicas">
          <thead>
            <tr>
              <th scope="col">Pod</th>
              <th scope="col">Phase</th>
              <th scope="col">Node</th>
              <th scope="col">IP</th>
              <th scope="col">Exit code</th>
              <th scope="col">Restarts</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {podItems.map((p) => (
              <tr key={p.metadata.name}>
                <td>{p.metadata.name}</td>
                <td>
                  <Phase phase={p.status?.phase} />
                </td>
                <td>{p.status?.node ?? ''}</td>
                <td>{p.status?.ip ?? ''}</td>
                <td>{p.status?.exitCode ?? ''}</td>
                <td>{p.status?.restartCount ?? 0}</td>
                <td>
                  <button type="button" aria-pressed={shown === p.metadata.name} onClick={() => setSelected(p.metadata.name)} aria-label={`Show log of ${p.metadata.name}`}>
                    Show log
                  </button>{' '}
                  {session.canWrite && p.status?.phase === 'Running' ? (
                    <button type="button" onClick={() => setTerminal(p.metadata.name)} aria-label={`Open a terminal in ${p.metadata.name}`}>
                      Terminal
                    </button>
                  ) : null}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {pods.loaded && podItems.length === 0 ? <p class="muted">No replicas yet.</p> : null}
      </Section>
      {terminal ? (
        <Section title={`Terminal in ${terminal}`}>
          <Suspense fallback={<p class="muted">Loading the terminal…</p>}>
            <Terminal namespace={namespace} pod={terminal} />
          </Suspense>
          <button type="button" onClick={() => setTerminal(null)}>
            Close terminal
          </button>
        </Section>
      ) : null}
      {shown ? (
        <Section title={`Log of ${shown}`}>
          <Logs namespace={namespace} pod={shown} />
        </Section>
      ) : null}
      <Section title="Rewards and metrics">
        <ReportChart namespace={namespace} task={name} />
      </Section>
      <Section title="Conditions">
        <Conditions conditions={task.status?.conditions} />
      </Section>
      <Section title="Events">
        <Events kind="Task" name={name} namespace={namespace} />
      </Section>
    </main>
  );
}

