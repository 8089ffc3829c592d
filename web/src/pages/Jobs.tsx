import { useState } from 'preact/hooks';
import { ApiError, KubeObject, mergePatch, request, resourcePath, RLINF, Session } from '../api';
import { age, Conditions, ErrorBanner, Phase, Section } from '../components/common';
import { Events } from '../components/Events';
import { VirtualList } from '../components/VirtualList';
import { href, navigate } from '../router';
import { useWatch, useWatchOne } from '../watch';

const PHASES = ['All', 'Pending', 'Running', 'Succeeded', 'Failed', 'Stopped'];

/** Name and phase filters over a watched list. */
export function useFilters() {
  const [phase, setPhase] = useState('All');
  const [text, setText] = useState('');
  const apply = (items: KubeObject[]) =>
    items
      .filter((o) => phase === 'All' || (o.status?.phase ?? 'Pending') === phase)
      .filter((o) => !text || o.metadata.name.includes(text))
      .sort((a, b) => String(b.metadata.creationTimestamp ?? '').localeCompare(String(a.metadata.creationTimestamp ?? '')) || a.metadata.name.localeCompare(b.metadata.name));
  const controls = (what: string) => (
    <div class="filters" role="search">
      <label>
        Phase{' '}
        <select value={phase} onChange={(e) => setPhase((e.target as HTMLSelectElement).value)} aria-label={`Filter ${what} by phase`}>
          {PHASES.map((p) => (
            <option key={p}>{p}</option>
          ))}
        </select>
      </label>
      <label>
        Name{' '}
        <input type="search" value={text} onInput={(e) => setText((e.target as HTMLInputElement).value)} aria-label={`Filter ${what} by name`} />
      </label>
    </div>
  );
  return { apply, controls };
}

export function Jobs() {
  const jobs = useWatch(`${RLINF}/jobs`);
  const { apply, controls } = useFilters();
  const items = apply(jobs.items);
  return (
    <main>
      <h1>Jobs</h1>
      <ErrorBanner error={jobs.error} />
      {controls('jobs')}
      <p class="muted" aria-live="polite">
        {jobs.loaded ? `${items.length} of ${jobs.items.length} jobs` : 'Loading…'}
      </p>
      <VirtualList
        label="Jobs"
        items={items}
        rowHeight={36}
        height={600}
        rowClass="with-reward"
        header={
          <div class="vlist-row vlist-head with-reward" role="row">
            <span role="columnheader">Name</span>
            <span role="columnheader">Phase</span>
            <span role="columnheader">Tasks</span>
            <span role="columnheader">Domain</span>
            <span role="columnheader" title="The newest and the mean reward of the job's tasks">Reward (last/mean)</span>
            <span role="columnheader">Age</span>
          </div>
        }
        render={(job) => (
          <>
            <span role="cell">
              <a href={href('jobs', job.metadata.name)}>{job.metadata.name}</a>
            </span>
            <span role="cell">
              <Phase phase={job.status?.phase} />
            </span>
            <span role="cell">{(job.status?.tasks ?? []).map((t: any) => `${t.name}:${t.phase ?? 'Pending'}`).join(' ')}</span>
            <span role="cell">{job.spec?.domain ?? ''}</span>
            <span role="cell" data-reward>{job.status?.reward?.summary ?? ''}</span>
            <span role="cell">{age(job)}</span>
          </>
        )}
      />
    </main>
  );
}

/** Tasks with their replicas and placement, live. */
export function TaskTable({ labelSelector }: { labelSelector: string }) {
  const tasks = useWatch(`${RLINF}/tasks`, { labelSelector });
  const items = [...tasks.items].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  return (
    <>
      <ErrorBanner error={tasks.error} />
      <table aria-label="Tasks">
        <thead>
          <tr>
            <th scope="col">Task</th>
            <th scope="col">Phase</th>
            <th scope="col">Replicas (ready/succeeded/failed of desired)</th>
            <th scope="col">Cluster</th>
            <th scope="col">Nodes</th>
            <th scope="col">Reward (last/mean)</th>
            <th scope="col">Message</th>
          </tr>
        </thead>
        <tbody>
          {items.map((t) => (
            <tr key={`${t.metadata.namespace}/${t.metadata.name}`}>
              <td>
                <a href={href('tasks', t.metadata.namespace ?? 'default', t.metadata.name)}>{t.metadata.name}</a>
              </td>
              <td>
                <Phase phase={t.status?.phase} />
              </td>
              <td>
                {t.status?.readyReplicas ?? 0}/{t.status?.succeededReplicas ?? 0}/{t.status?.failedReplicas ?? 0} of {t.status?.replicas ?? '?'}
              </td>
              <td>{t.spec?.placement?.clusterID ?? ''}</td>
              <td>{(t.spec?.placement?.nodes ?? []).join(', ')}</td>
              <td>{t.status?.reward?.summary ?? ''}</td>
              <td>{t.status?.message ?? ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}

export function JobDetail({ name, session }: { name: string; session: Session }) {
  const { object: job, loaded, error } = useWatchOne(`${RLINF}/jobs`, name);
  const [actionError, setActionError] = useState<string | null>(null);
  const path = resourcePath('jobs', undefined, name);
  const act = async (what: () => Promise<unknown>) => {
    setActionError(null);
    try {
      await what();
    } catch (e) {
      setActionError(e instanceof ApiError ? e.message : String(e));
    }
  };
  if (!job) {
    return (
      <main>
        <h1>Job {name}</h1>
        <ErrorBanner error={error} />
        {loaded ? <p>Job {name} does not exist (or was deleted).</p> : <p>Loading…</p>}
      </main>
    );
  }
  const stopped = job.spec?.stopped === true;
  return (
    <main>
      <h1>
        Job {name} <Phase phase={job.status?.phase} />
      </h1>
      <ErrorBanner error={actionError ?? error} />
      {session.canWrite ? (
        <div class="actions">
          {stopped ? (
            <button type="button" onClick={() => act(() => mergePatch(path, { spec: { stopped: false } }))}>
              Resume
            </button>
          ) : (
            <button type="button" onClick={() => act(() => mergePatch(path, { spec: { stopped: true } }))}>
              Stop
            </button>
          )}
          <button
            type="button"
            onClick={() => act(() => mergePatch(path, { metadata: { annotations: { 'rlark.io/restarted-at': new Date().toISOString() } } }))}
          >
            Restart
          </button>
          <button
            type="button"
            class="danger"
            onClick={() =>
              window.confirm(`Delete job ${name} and its tasks?`) &&
              act(async () => {
                await request(path, { method: 'DELETE' });
                navigate('jobs');
              })
            }
          >
            Delete
          </button>
        </div>
      ) : null}
      <dl class="facts">
        <dt>Domain</dt>
        <dd>{job.spec?.domain ? <a href={href('domains', job.spec.domain)}>{job.spec.domain}</a> : '—'}</dd>
        <dt>Started</dt>
        <dd>{job.status?.startTime ?? '—'}</dd>
        <dt>Ended</dt>
        <dd>{job.status?.endTime ?? '—'}</dd>
        <dt>Workflow</dt>
        <dd>{job.metadata.labels?.['rlinf.io/workflow'] ? <a href={href('workflows', job.metadata.labels['rlinf.io/workflow'])}>{job.metadata.labels['rlinf.io/workflow']}</a> : '—'}</dd>
      </dl>
      <Section title="Tasks">
        <TaskTable labelSelector={`rlinf.io/job=${name}`} />
      </Section>
      <Section title="Conditions">
        <Conditions conditions={job.status?.conditions} />
      </Section>
      <Section title="Events">
        <Events kind="Job" name={name} />
      </Section>
    </main>
  );
}
