import { useEffect, useState } from 'preact/hooks';
import { ApiError, getJson, KubeObject, RLINF, sendJson, Session } from '../api';
import { CameraView } from '../components/CameraView';
import { parseArgs } from '../robotArgs';
import { ErrorBanner, Section } from '../components/common';
import { useWatch } from '../watch';

interface Viewed {
  namespace: string;
  node: string;
  camera: string;
}

interface Robot {
  id: string;
  type: string;
  backend: string;
  state: string;
  mode: string;
  message: string;
  ownerPid: number;
}

function robotsPath(node: KubeObject) {
  return `/rlark/v1/namespaces/${encodeURIComponent(node.metadata.namespace ?? '')}/nodes/${encodeURIComponent(node.metadata.name)}/robots`;
}

/** The robots on one Node's host, read from its agent; admins start, stop, switch and reset them. */
function Robots({ node, session }: { node: KubeObject; session: Session }) {
  const [robots, setRobots] = useState<Robot[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const [modes, setModes] = useState<Record<string, string>>({});
  const [argTexts, setArgTexts] = useState<Record<string, string>>({});
  const path = robotsPath(node);
  // Read again when the agent reports the Node's devices anew (no polling).
  const devices = JSON.stringify(node.status?.devices ?? []);
  useEffect(() => {
    const controller = new AbortController();
    getJson(path, controller.signal)
      .then((r) => {
        setRobots(r.items ?? []);
        setError(null);
      })
      .catch((e) => controller.signal.aborted || setError(e instanceof ApiError ? e.message : String(e)));
    return () => controller.abort();
  }, [path, devices]);

  const act = async (robot: Robot, action: string) => {
    setBusy(robot.id);
    setError(null);
    try {
      const mode = modes[robot.id]?.trim();
      const parsed = parseArgs(argTexts[robot.id] ?? '');
      if ('error' in parsed) throw new Error(parsed.error);
      const body: Record<string, unknown> = {};
      if (mode) body.mode = mode;
      if (Object.keys(parsed.args).length && (action === 'start' || action === 'switch')) body.args = parsed.args;
      const updated: Robot = await sendJson('POST', `${path}/${encodeURIComponent(robot.id)}/${action}`, body);
      setRobots((rs) => rs.map((r) => (r.id === updated.id ? updated : r)));
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(null);
    }
  };

  return (
    <Section title={`Robots on ${node.metadata.name}`}>
      <ErrorBanner error={error} />
      <table aria-label={`Robots on ${node.metadata.name}`}>
        <thead>
          <tr>
            <th scope="col">Robot</th>
            <th scope="col">Type</th>
            <th scope="col">Backend</th>
            <th scope="col">State</th>
            <th scope="col">Mode</th>
            <th scope="col">Message</th>
            {session.canWrite ? <th scope="col">Actions</th> : null}
          </tr>
        </thead>
        <tbody>
          {robots.map((r) => (
            <tr key={r.id} data-robot={r.id}>
              <td>{r.id}</td>
              <td>{r.type}</td>
              <td>{r.backend}</td>
              <td data-testid="robot-state">{r.state}</td>
              <td data-testid="robot-mode">{r.mode}</td>
              <td>{r.message}</td>
              {session.canWrite ? (
                <td class="robot-actions">
                  <input
                    aria-label={`Mode for ${r.id}`}
                    placeholder="mode"
                    size={8}
                    value={modes[r.id] ?? ''}
                    onInput={(e) => setModes((m) => ({ ...m, [r.id]: (e.target as HTMLInputElement).value }))}
                  />
                  <input
                    aria-label={`Launch arguments for ${r.id} (NAME=VALUE ...)`}
                    placeholder="NAME=VALUE ..."
                    size={14}
                    value={argTexts[r.id] ?? ''}
                    onInput={(e) => setArgTexts((m) => ({ ...m, [r.id]: (e.target as HTMLInputElement).value }))}
                  />
                  {r.state === 'RUNNING' ? (
                    <>
                      <button type="button" disabled={busy === r.id} onClick={() => act(r, 'switch')} aria-label={`Switch ${r.id} to the mode`}>
                        Switch
                      </button>
                      <button type="button" disabled={busy === r.id} onClick={() => act(r, 'stop')} aria-label={`Stop ${r.id}`}>
                        Stop
                      </button>
                    </>
                  ) : (
                    <button type="button" disabled={busy === r.id} onClick={() => act(r, 'start')} aria-label={`Start ${r.id}`}>
                      Start
                    </button>
                  )}
                  <button type="button" disabled={busy === r.id} onClick={() => act(r, 'reset')} aria-label={`Reset ${r.id}`}>
                    Reset
                  </button>
                </td>
              ) : null}
            </tr>
          ))}
        </tbody>
      </table>
    </Section>
  );
}

interface Camera {
  id: string;
  name: string;
  type: string;
  state: string;
  width: number;
  height: number;
  fps: number;
}

/** The cameras on one Node's host, read from its agent; anyone who may read the Node views
 * an open one; admins open and close them. */
function Cameras({ node, session, onView }: { node: KubeObject; session: Session; onView: (v: Viewed) => void }) {
  const [cameras, setCameras] = useState<Camera[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const path = `/rlark/v1/namespaces/${encodeURIComponent(node.metadata.namespace ?? '')}/nodes/${encodeURIComponent(node.metadata.name)}/cameras`;
  const devices = JSON.stringify(node.status?.devices ?? []);
  useEffect(() => {
    const controller = new AbortController();
    getJson(path, controller.signal)
      .then((r) => {
        setCameras(r.items ?? []);
        setError(null);
      })
      .catch((e) => controller.signal.aborted || setError(e instanceof ApiError ? e.message : String(e)));
    return () => controller.abort();
  }, [path, devices]);
  const act = async (camera: Camera, action: string) => {
    setBusy(camera.id);
    setError(null);
    try {
      const updated: Camera = await sendJson('POST', `${path}/${encodeURIComponent(camera.id)}/${action}`, {});
      setCameras((cs) => cs.map((c) => (c.id === updated.id ? updated : c)));
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(null);
    }
  };
  return (
    <Section title={`Cameras on ${node.metadata.name}`}>
      <ErrorBanner error={error} />
      <table aria-label={`Cameras on ${node.metadata.name}`}>
        <thead>
          <tr>
            <th scope="col">Camera</th>
            <th scope="col">Type</th>
            <th scope="col">State</th>
            <th scope="col">Size</th>
            <th scope="col">FPS</th>
            <th scope="col">Actions</th>
          </tr>
        </thead>
        <tbody>
          {cameras.map((c) => (
            <tr key={c.id} data-camera={c.id}>
              <td>{c.id}</td>
              <td>{c.type}</td>
              <td data-testid="camera-state">{c.state}</td>
              <td>{c.width && c.height ? `${c.width}×${c.height}` : ''}</td>
              <td>{c.fps || ''}</td>
              <td class="robot-actions">
                <button
                  type="button"
                  aria-label={`View camera ${c.id} on ${node.metadata.name}`}
                  onClick={() => onView({ namespace: node.metadata.namespace ?? '', node: node.metadata.name, camera: c.id })}
                >
                  View
                </button>
                {session.canWrite ? (
                  c.state === 'OPEN' ? (
                    <button type="button" disabled={busy === c.id} onClick={() => act(c, 'close')} aria-label={`Close camera ${c.id}`}>
                      Close
                    </button>
                  ) : (
                    <button type="button" disabled={busy === c.id} onClick={() => act(c, 'open')} aria-label={`Open camera ${c.id}`}>
                      Open
                    </button>
                  )
                ) : null}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </Section>
  );
}

/** Robots and cameras the agents report on their Nodes (`status.devices`), live. */
export function Devices({ session }: { session: Session }) {
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
      {nodes.items
        .filter((n) => (n.status?.devices ?? []).some((d: any) => String(d.id).startsWith('camera-')))
        .map((n) => (
          <Cameras key={`${n.metadata.namespace}/${n.metadata.name}`} node={n} session={session} onView={setViewed} />
        ))}
      {nodes.items
        .filter((n) => (n.status?.devices ?? []).some((d: any) => String(d.id).startsWith('robot-')))
        .map((n) => (
          <Robots key={`${n.metadata.namespace}/${n.metadata.name}`} node={n} session={session} />
        ))}
      {viewed ? (
        <Section title={`Camera ${viewed.camera} on ${viewed.node}`}>
          <p class="muted">A camera is viewed while it is open; viewing does not change it. When the stream drops or the camera is closed, the view waits and opens again by itself.</p>
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
