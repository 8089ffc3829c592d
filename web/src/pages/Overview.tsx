import { useEffect, useState } from 'preact/hooks';
import { getJson, RLINF } from '../api';
import { ErrorBanner, Section } from '../components/common';
import { href } from '../router';
import { useWatch } from '../watch';

export interface ClusterSummary {
  id: string;
  namespace: string;
  phase: string;
  totalNodes: number;
  onlineNodes: number;
  offlineNodes: number;
  cordonedNodes: number;
  gpus: { total: number; used: number; free: number };
  devices: { total: number; used: number; free: number };
  runningJobs: number;
}

/** `/rlark/v1/clusters`, read again whenever a Node or Task changes (driven by watches). */
export function useClusters(): { clusters: ClusterSummary[]; error: string | null; loaded: boolean } {
  const nodes = useWatch(`${RLINF}/nodes`);
  const tasks = useWatch(`${RLINF}/tasks`);
  const [state, setState] = useState<{ clusters: ClusterSummary[]; error: string | null; loaded: boolean }>({ clusters: [], error: null, loaded: false });
  useEffect(() => {
    if (!nodes.loaded || !tasks.loaded) return;
    const controller = new AbortController();
    // Bursts of Node and Task changes cost one read.
    const timer = setTimeout(() => {
      getJson('/rlark/v1/clusters', controller.signal)
        .then((r) => setState({ clusters: r.items, error: null, loaded: true }))
        .catch((e) => controller.signal.aborted || setState((s) => ({ ...s, error: e.message, loaded: true })));
    }, 200);
    return () => {
      clearTimeout(timer);
      controller.abort();
    };
  }, [nodes.items, tasks.items, nodes.loaded, tasks.loaded]);
  return state;
}

function count<T>(items: T[], pred: (t: T) => boolean) {
  return items.filter(pred).length;
}

export function Overview() {
  const { clusters, error, loaded } = useClusters();
  const jobs = useWatch(`${RLINF}/jobs`);
  const workflows = useWatch(`${RLINF}/workflows`);
  const phase = (p: string) => (o: any) => (o.status?.phase ?? 'Pending') === p;
  const totals = clusters.reduce(
    (t, c) => ({
      nodes: t.nodes + c.totalNodes,
      online: t.online + c.onlineNodes,
      gpus: t.gpus + c.gpus.total,
      gpusUsed: t.gpusUsed + c.gpus.used,
      devices: t.devices + c.devices.total,
      devicesUsed: t.devicesUsed + c.devices.used,
    }),
    { nodes: 0, online: 0, gpus: 0, gpusUsed: 0, devices: 0, devicesUsed: 0 },
  );
  return (
    <main>
      <h1>Overview</h1>
      <ErrorBanner error={error ?? jobs.error} />
      <div class="cards">
        <Card label="Clusters" value={clusters.length} testid="clusters" />
        <Card label="Nodes online" value={`${totals.online} / ${totals.nodes}`} testid="nodes-online" />
        <Card label="GPUs used" value={`${totals.gpusUsed} / ${totals.gpus}`} testid="gpus" />
        <Card label="Devices used" value={`${totals.devicesUsed} / ${totals.devices}`} testid="devices" />
        <Card label="Jobs running" value={count(jobs.items, phase('Running'))} testid="jobs-running" />
        <Card label="Jobs" value={jobs.items.length} testid="jobs-total" />
        <Card label="Workflows" value={workflows.items.length} testid="workflows-total" />
      </div>
      <Section title="Clusters">
        {loaded && clusters.length === 0 ? <p class="muted">No clusters yet: join an agent with rlark join.</p> : null}
        <table aria-label="Clusters">
          <thead>
            <tr>
              <th scope="col">Cluster</th>
              <th scope="col">Phase</th>
              <th scope="col">Nodes (online/total)</th>
              <th scope="col">GPUs free</th>
              <th scope="col">Devices free</th>
              <th scope="col">Running jobs</th>
            </tr>
          </thead>
          <tbody>
            {clusters.map((c) => (
              <tr key={c.id}>
                <td>
                  <a href={href('clusters', c.id)}>{c.id}</a>
                </td>
                <td>
                  <span class={`phase phase-${c.phase.toLowerCase()}`}>{c.phase}</span>
                </td>
                <td>
                  {c.onlineNodes}/{c.totalNodes}
                  {c.cordonedNodes ? ` (${c.cordonedNodes} cordoned)` : ''}
                </td>
                <td>
                  {c.gpus.free} of {c.gpus.total}
                </td>
                <td>
                  {c.devices.free} of {c.devices.total}
                </td>
                <td>{c.runningJobs}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
    </main>
  );
}

function Card({ label, value, testid }: { label: string; value: string | number; testid: string }) {
  return (
    <div class="card" data-testid={`card-${testid}`}>
      <div class="card-value">{value}</div>
      <div class="card-label">{label}</div>
    </div>
  );
}
