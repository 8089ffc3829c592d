import { lazy, Suspense } from 'preact/compat';
import { useState } from 'preact/hooks';
import { KubeObject, Session } from '../api';
import { resourcePath } from '../api';
import { Conditions, ErrorBanner, Phase, Section } from '../components/common';
import { Events } from '../components/Events';
import { Logs } from '../components/Logs';
import { ReportChart } from '../components/ReportChart';
import { TaskAppButton } from '../components/TaskAppButton';
import { compareHref } from '../chart';
import { mayReach, parsePort } from '../proxy';
import { href } from '../router';
import { useWatch, useWatchOne } from '../watch';

// xterm.js is loaded only when a terminal is opened.
const Terminal = lazy(() => import('../components/Terminal'));

/** Buttons that open web apps a running replica serves, through the task HTTP proxy on its
 * own origin (docs/ssh.md; a one-time link per press): offered to those the server lets
 * through (admins, the users and groups of the Job's `spec.access`). A task with
 * `tensorBoardDir` gets a TensorBoard beside each replica from its agent: a button per
 * replica whose Pod reports its port (`status.tensorBoard`), else the reason the Pod gives. */
function WebApps({ task, pods }: { task: KubeObject; pods: KubeObject[] }) {
  const namespace = task.metadata.namespace ?? 'default';
  const name = task.metadata.name;
  const tensorBoardDir: string | undefined = task.spec?.tensorBoardDir;
  const [portText, setPortText] = useState('');
  const [index, setIndex] = useState(0);
  // A raw replica inside a Domain listens in its own network namespace, which the proxy
  // cannot reach (400); only running replicas answer.
  const reachable = pods.filter((p) => p.status?.phase === 'Running' && !(task.spec?.agentType === 'Raw' && p.spec?.domain));
  const port = parsePort(portText);
  const replica = reachable.find((p) => (p.spec?.replicaIndex ?? 0) === index) ?? reachable[0];
  const replicaIndex = replica?.spec?.replicaIndex ?? 0;
  return (
    <Section title="Web apps">
      {tensorBoardDir ? <TensorBoards namespace={namespace} task={name} logDir={tensorBoardDir} pods={pods} /> : null}
      {reachable.length === 0 ? (
        <p class="muted">No replica the proxy can reach runs now (it reaches running replicas, not raw ones inside a Domain).</p>
      ) : (
        <form class="inline-form" onSubmit={(e) => e.preventDefault()}>
          <label>
            Port{' '}
            <input inputMode="numeric" size={6} value={portText} onInput={(e) => setPortText((e.target as HTMLInputElement).value)} aria-invalid={portText !== '' && port === null} />
          </label>{' '}
          <label>
            Replica{' '}
            <select value={String(replicaIndex)} onChange={(e) => setIndex(Number((e.target as HTMLSelectElement).value))}>
              {reachable.map((p) => (
                <option key={p.metadata.name} value={String(p.spec?.replicaIndex ?? 0)}>
                  {p.metadata.name}
                </option>
              ))}
            </select>
          </label>{' '}
          {port !== null ? (
            <TaskAppButton app={{ namespace, task: name, replica: replicaIndex === 0 ? undefined : replicaIndex, port }} testId="proxy-link">
              Open port {port} of {replica?.metadata.name}
            </TaskAppButton>
          ) : (
            <span class="muted">{portText === '' ? 'Give the port a web app listens on in the replica.' : `${portText} is not a port (1-65535).`}</span>
          )}
        </form>
      )}
    </Section>
  );
}

/** The TensorBoard of each replica as its Pod reports it (`status.tensorBoard`: the port, or
 * why none runs). */
function TensorBoards({ namespace, task, logDir, pods }: { namespace: string; task: string; logDir: string; pods: KubeObject[] }) {
  const sorted = [...pods].sort((a, b) => (a.spec?.replicaIndex ?? 0) - (b.spec?.replicaIndex ?? 0));
  return (
    <div data-testid="tensorboards">
      <p>
        TensorBoard reads <code>{logDir}</code>; the agent starts one beside each running replica.
      </p>
      {sorted.length === 0 ? <p class="muted">No replica runs now.</p> : null}
      <ul>
        {sorted.map((pod) => {
          const index: number = pod.spec?.replicaIndex ?? 0;
          const board = pod.status?.tensorBoard;
          const port: number | undefined = board?.port ?? undefined;
          return (
            <li key={pod.metadata.name}>
              {port ? (
                <TaskAppButton app={{ namespace, task, replica: index === 0 ? undefined : index, port }} testId={`tensorboard-link-${index}`}>
                  TensorBoard of {pod.metadata.name}
                </TaskAppButton>
              ) : (
                <span data-testid={`tensorboard-status-${index}`}>
                  {pod.metadata.name}: {board?.message ?? `no TensorBoard (the replica is ${pod.status?.phase ?? 'Pending'})`}
                </span>
              )}
            </li>
          );
        })}
      </ul>
    </div>
  );
}

export function TaskDetail({ namespace, name, session }: { namespace: string; name: string; session: Session }) {
  const { object: task, loaded, error } = useWatchOne(resourcePath('tasks', namespace), name);
  const pods = useWatch(resourcePath('pods', namespace), { labelSelector: `rlark.io/task-name=${name}` });
  const [selected, setSelected] = useState<string | null>(null);
  const [terminal, setTerminal] = useState<string | null>(null);
  const job: string | undefined = task?.metadata.labels?.['rlinf.io/job'];
  const jobObject = useWatchOne(job ? resourcePath('jobs') : null, job ?? '').object;
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
      <Section title="Rewards and metrics">
        <p>
          <a href={compareHref([{ namespace, name }])}>Compare with other runs</a>
        </p>
        <ReportChart namespace={namespace} task={name} />
      </Section>
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
      {shown ? (
        <Section title={`Log of ${shown}`}>
          <Logs namespace={namespace} pod={shown} />
        </Section>
      ) : null}
      {mayReach(session, jobObject) ? <WebApps task={task} pods={podItems} /> : null}
      <Section title="Conditions">
        <Conditions conditions={task.status?.conditions} />
      </Section>
      <Section title="Events">
        <Events kind="Task" name={name} namespace={namespace} />
      </Section>
      {/* Last on the page: the terminal keeps Tab for the shell, and Shift+Tab leaves it
          backwards, to its Close button and everything else. */}
      {terminal ? (
        <Section title={`Terminal in ${terminal}`}>
          <button type="button" onClick={() => setTerminal(null)}>
            Close terminal
          </button>
          <Suspense fallback={<p class="muted">Loading the terminal…</p>}>
            <Terminal namespace={namespace} pod={terminal} />
          </Suspense>
        </Section>
      ) : null}
    </main>
  );
}

