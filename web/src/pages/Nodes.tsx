import { useState } from 'preact/hooks';
import { ApiError, KubeObject, mergePatch, resourcePath, RLINF, Session } from '../api';
import { ActionButton, ErrorBanner } from '../components/common';
import { useWatch } from '../watch';

function resources(list: Record<string, string | number> | undefined): string {
  if (!list) return '';
  return Object.entries(list)
    .filter(([k]) => k === 'cpu' || k === 'memory' || k.includes('gpu') || k.startsWith('rlinf.io/'))
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
}

/** Nodes of every cluster (or one), live, with cordon and uncordon for admins. */
export function Nodes({ session, cluster }: { session: Session; cluster?: string }) {
  const nodes = useWatch(`${RLINF}/nodes`, cluster ? { labelSelector: `rlark.io/cluster-id=${cluster}` } : {});
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const items = [...nodes.items].sort((a, b) =>
    `${a.metadata.namespace}/${a.metadata.name}`.localeCompare(`${b.metadata.namespace}/${b.metadata.name}`),
  );

  const setCordon = async (node: KubeObject, unschedulable: boolean) => {
    setBusy(node.metadata.name);
    setError(null);
    try {
      await mergePatch(resourcePath('nodes', node.metadata.namespace, node.metadata.name), { spec: { unschedulable } });
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(null);
    }
  };

  return (
    <main>
      <h1>{cluster ? `Cluster ${cluster}` : 'Clusters and nodes'}</h1>
      <ErrorBanner error={error ?? nodes.error} />
      {nodes.loaded && items.length === 0 ? <p class="muted">No nodes.</p> : null}
      <table aria-label="Nodes">
        <thead>
          <tr>
            <th scope="col">Cluster</th>
            <th scope="col">Node</th>
            <th scope="col">Status</th>
            <th scope="col">Schedulable</th>
            <th scope="col">Allocatable</th>
            <th scope="col">Used</th>
            <th scope="col">Heartbeat</th>
            {session.canWrite ? <th scope="col">Actions</th> : null}
          </tr>
        </thead>
        <tbody>
          {items.map((n) => {
            const cordoned = n.spec?.unschedulable === true;
            return (
              <tr key={`${n.metadata.namespace}/${n.metadata.name}`} data-node={n.metadata.name}>
                <td>{n.metadata.labels?.['rlark.io/cluster-id'] ?? n.metadata.namespace}</td>
                <td>{n.metadata.name}</td>
                <td>
                  <span class={`phase phase-${String(n.status?.phase ?? 'unknown').toLowerCase()}`}>{n.status?.phase ?? 'Unknown'}</span>
                </td>
                <td data-testid="schedulable">{cordoned ? 'Cordoned' : 'Yes'}</td>
                <td class="small">{resources(n.status?.allocatable)}</td>
                <td class="small">{resources(n.status?.used)}</td>
                <td class="small">{n.status?.heartbeatTime ?? ''}</td>
                {session.canWrite ? (
                  <td>
                    <ActionButton
                      busy={busy === n.metadata.name}
                      onClick={() => setCordon(n, !cordoned)}
                      aria-label={`${cordoned ? 'Uncordon' : 'Cordon'} node ${n.metadata.name}`}
                    >
                      {cordoned ? 'Uncordon' : 'Cordon'}
                    </ActionButton>
                  </td>
                ) : null}
              </tr>
            );
          })}
        </tbody>
      </table>
    </main>
  );
}
