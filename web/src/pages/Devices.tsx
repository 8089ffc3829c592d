import { RLINF } from '../api';
import { ErrorBanner } from '../components/common';
import { useWatch } from '../watch';

/** Robots and cameras the agents report on their Nodes (`status.devices`), live. */
export function Devices() {
  const nodes = useWatch(`${RLINF}/nodes`);
  const rows = nodes.items.flatMap((n) =>
    (n.status?.devices ?? []).map((d: any) => ({
      ...d,
      node: n.metadata.name,
      cluster: n.metadata.labels?.['rlark.io/cluster-id'] ?? n.metadata.namespace,
    })),
  );
  rows.sort((a, b) => `${a.cluster}/${a.node}/${a.id}`.localeCompare(`${b.cluster}/${b.node}/${b.id}`));
  return (
    <main>
      <h1>Devices</h1>
      <ErrorBanner error={nodes.error} />
      {nodes.loaded && rows.length === 0 ? <p class="muted">No robots or cameras: start an agent with --embodied-socket-dir.</p> : null}
      <table aria-label="Devices">
        <thead>
          <tr>
            <th scope="col">Cluster</th>
            <th scope="col">Node</th>
            <th scope="col">Device</th>
            <th scope="col">Resource</th>
            <th scope="col">Health</th>
            <th scope="col">Message</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((d) => (
            <tr key={`${d.cluster}/${d.node}/${d.id}`}>
              <td>{d.cluster}</td>
              <td>{d.node}</td>
              <td>{d.id}</td>
              <td>{d.resource}</td>
              <td>
                <span class={`phase phase-${d.health === 'Healthy' ? 'online' : 'offline'}`}>{d.health}</span>
              </td>
              <td>{d.message ?? ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </main>
  );
}
