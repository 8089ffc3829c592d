import { useState } from 'preact/hooks';
import { RLINF } from '../api';
import { CameraView } from '../components/CameraView';
import { ErrorBanner, Section } from '../components/common';
import { useWatch } from '../watch';

interface Viewed {
  namespace: string;
  node: string;
  camera: string;
}

/** Robots and cameras the agents report on their Nodes (`status.devices`), live. */
export function Devices() {
  const nodes = useWatch(`${RLINF}/nodes`);
  const [viewed, setViewed] = useState<Viewed | null>(null);
  const rows = nodes.items.flatMap((n) =>
    (n.status?.devices ?? []).map((d: any) => ({
      ...d,
      node: n.metadata.name,
      namespace: n.metadata.namespace ?? '',
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
            <th scope="col">Live view</th>
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
              <td>
                {String(d.id).startsWith('camera-') ? (
                  <button
                    type="button"
                    aria-label={`View camera ${d.id.slice('camera-'.length)} on ${d.node}`}
                    onClick={() => setViewed({ namespace: d.namespace, node: d.node, camera: d.id.slice('camera-'.length) })}
                  >
                    View
                  </button>
                ) : null}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {viewed ? (
        <Section title={`Camera ${viewed.camera} on ${viewed.node}`}>
          <p class="muted">A camera is viewed while it is open (rlark camera open {viewed.camera}); viewing does not change it.</p>
          <CameraView namespace={viewed.namespace} node={viewed.node} camera={viewed.camera} />
          <div class="actions">
            <button type="button" onClick={() => setViewed(null)}>
              Close view
            </button>
          </div>
        </Section>
      ) : null}
    </main>
  );
}
