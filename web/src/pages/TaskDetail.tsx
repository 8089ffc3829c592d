import { useState } from 'preact/hooks';
import { resourcePath } from '../api';
import { Conditions, ErrorBanner, Phase, Section } from '../components/common';
import { Events } from '../components/Events';
import { Logs } from '../components/Logs';
import { href } from '../router';
import { useWatch, useWatchOne } from '../watch';

export function TaskDetail({ namespace, name }: { namespace: string; name: string }) {
  const { object: task, loaded, error } = useWatchOne(resourcePath('tasks', namespace), name);
  const pods = useWatch(resourcePath('pods', namespace), { labelSelector: `rlark.io/task-name=${name}` });
  const [selected, setSelected] = useState<string | null>(null);
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
              <th scope="col">Log</th>
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
                  <button type="button" aria-pressed={shown === p.metadata.name} onClick={() => setSelected(p.metadata.name)}>
                    Show log
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {pods.loaded && podItems.length === 0 ? <p class="muted">No replicas yet.</p> : null}
      </Section>
      {shown ? (
        <Section title={`Log of ${shown}`}>
          <Logs namespace={namespace} pod={shown} />
        </Section>
      ) : null}
      <Section title="Conditions">
        <Conditions conditions={task.status?.conditions} />
      </Section>
      <Section title="Events">
        <Events kind="Task" name={name} namespace={namespace} />
      </Section>
    </main>
  );
}

