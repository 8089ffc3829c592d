import { useState } from 'preact/hooks';
import { ApiError, mergePatch, request, resourcePath, RLINF, Session } from '../api';
import { age, Conditions, ErrorBanner, Phase, Section } from '../components/common';
import { Events } from '../components/Events';
import { VirtualList } from '../components/VirtualList';
import { layoutDag } from '../dag';
import { href, navigate } from '../router';
import { useWatch, useWatchOne } from '../watch';
import { useFilters } from './Jobs';

export function Workflows() {
  const workflows = useWatch(`${RLINF}/workflows`);
  const { apply, controls } = useFilters();
  const items = apply(workflows.items);
  return (
    <main>
      <h1>Workflows</h1>
      <ErrorBanner error={workflows.error} />
      {controls('workflows')}
      <p class="muted" aria-live="polite">
        {workflows.loaded ? `${items.length} of ${workflows.items.length} workflows` : 'Loading…'}
      </p>
      <VirtualList
        label="Workflows"
        items={items}
        rowHeight={36}
        height={600}
        header={
          <div class="vlist-row vlist-head" role="row">
            <span role="columnheader">Name</span>
            <span role="columnheader">Phase</span>
            <span role="columnheader">Jobs</span>
            <span role="columnheader">Age</span>
          </div>
        }
        render={(wf) => (
          <>
            <span role="cell">
              <a href={href('workflows', wf.metadata.name)}>{wf.metadata.name}</a>
            </span>
            <span role="cell">
              <Phase phase={wf.status?.phase} />
            </span>
            <span role="cell">{(wf.spec?.jobTemplates ?? []).length}</span>
            <span role="cell">{age(wf)}</span>
          </>
        )}
      />
    </main>
  );
}

const BOX_W = 170;
const BOX_H = 44;
const GAP_X = 70;
const GAP_Y = 24;

/** The Workflow's DAG as SVG: a box per job template, coloured by its Job's phase. */
export function Dag({ workflow }: { workflow: any }) {
  const templates = (workflow.spec?.jobTemplates ?? []).map((t: any) => ({ name: t.name, dependencies: t.dependencies ?? [] }));
  const phases = new Map<string, string>((workflow.status?.jobs ?? []).map((j: any) => [j.name, j.phase ?? 'Pending']));
  const layout = layoutDag(templates);
  const pos = new Map(layout.nodes.map((n) => [n.name, { x: n.column * (BOX_W + GAP_X) + 10, y: n.row * (BOX_H + GAP_Y) + 10 }]));
  const width = layout.columns * (BOX_W + GAP_X) - GAP_X + 20;
  const height = layout.rows * (BOX_H + GAP_Y) - GAP_Y + 20;
  const jobName = (t: string) => `${workflow.metadata.name}-${t}`;
  return (
    <figure class="dag">
      <svg width={Math.max(width, 100)} height={Math.max(height, 60)} role="img" aria-label={`DAG of workflow ${workflow.metadata.name}`}>
        <defs>
          <marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse">
            <path d="M 0 0 L 10 5 L 0 10 z" fill="#888" />
          </marker>
        </defs>
        {layout.edges.map((e) => {
          const a = pos.get(e.from)!;
          const b = pos.get(e.to)!;
          const x1 = a.x + BOX_W;
          const y1 = a.y + BOX_H / 2;
          const x2 = b.x;
          const y2 = b.y + BOX_H / 2;
          const mid = (x1 + x2) / 2;
          return <path key={`${e.from}-${e.to}`} d={`M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`} fill="none" stroke="#888" marker-end="url(#arrow)" />;
        })}
        {layout.nodes.map((n) => {
          const p = pos.get(n.name)!;
          const phase = phases.get(n.name) ?? 'Pending';
          return (
            <a key={n.name} href={href('jobs', jobName(n.name))} aria-label={`job ${n.name}: ${phase}`}>
              <rect x={p.x} y={p.y} width={BOX_W} height={BOX_H} rx="6" class={`dag-node dag-${phase.toLowerCase()}`} />
              <text x={p.x + 10} y={p.y + 18} class="dag-name">
                {n.name}
              </text>
              <text x={p.x + 10} y={p.y + 35} class="dag-phase">
                {phase}
              </text>
            </a>
          );
        })}
      </svg>
      {layout.problems.length ? <figcaption class="error">{layout.problems.join('; ')}</figcaption> : null}
    </figure>
  );
}

export function WorkflowDetail({ name, session }: { name: string; session: Session }) {
  const { object: wf, loaded, error } = useWatchOne(`${RLINF}/workflows`, name);
  const [actionError, setActionError] = useState<string | null>(null);
  const path = resourcePath('workflows', undefined, name);
  const act = async (what: () => Promise<unknown>) => {
    setActionError(null);
    try {
      await what();
    } catch (e) {
      setActionError(e instanceof ApiError ? e.message : String(e));
    }
  };
  if (!wf) {
    return (
      <main>
        <h1>Workflow {name}</h1>
        <ErrorBanner error={error} />
        {loaded ? <p>Workflow {name} does not exist (or was deleted).</p> : <p>Loading…</p>}
      </main>
    );
  }
  return (
    <main>
      <h1>
        Workflow {name} <Phase phase={wf.status?.phase} />
      </h1>
      <ErrorBanner error={actionError ?? error} />
      {session.canWrite ? (
        <div class="actions">
          {wf.spec?.stopped ? (
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
            class="danger"
            onClick={() =>
              window.confirm(`Delete workflow ${name} and its jobs?`) &&
              act(async () => {
                await request(path, { method: 'DELETE' });
                navigate('workflows');
              })
            }
          >
            Delete
          </button>
        </div>
      ) : null}
      <Section title="DAG">
        <Dag workflow={wf} />
      </Section>
      <Section title="Jobs">
        <table aria-label="Workflow jobs">
          <thead>
            <tr>
              <th scope="col">Job</th>
              <th scope="col">Phase</th>
              <th scope="col">Message</th>
            </tr>
          </thead>
          <tbody>
            {(wf.status?.jobs ?? []).map((j: any) => (
              <tr key={j.name}>
                <td>
                  <a href={href('jobs', `${name}-${j.name}`)}>{j.name}</a>
                </td>
                <td>
                  <Phase phase={j.phase} />
                </td>
                <td>{j.message ?? ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
      <Section title="Conditions">
        <Conditions conditions={wf.status?.conditions} />
      </Section>
      <Section title="Events">
        <Events kind="Workflow" name={name} />
      </Section>
    </main>
  );
}
