import { useEffect, useState } from 'preact/hooks';
import { ApiError, getJson, KubeObject, RLINF, sendJson, Session } from '../api';
import { followLines } from '../changes';
import { CameraView } from '../components/CameraView';
import { parseArgs } from '../robotArgs';
import { ActionButton, ErrorBanner, Section } from '../components/common';
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

/** What of a robot changes when its runtime logs a transition. */
const robotVersion = (r: Robot | undefined) => (r ? `${r.state}/${r.mode}/${r.message}` : '');

function robotsPath(node: KubeObject) {
  return `/rlark/v1/namespaces/${encodeURIComponent(node.metadata.namespace ?? '')}/nodes/${encodeURIComponent(node.metadata.name)}/robots`;
}

interface Mode {
  name: string;
  package: string;
  launchFile: string;
  args: Record<string, string>;
}

/** One robot's modes (with their launch files) and recent log, read from its agent when
 * shown and again when `version` changes (an action on it, or its state or mode pushed by
 * the agent: the runtime logs every transition) or on Refresh. */
function RobotDetails({
  path,
  robot,
  version,
  onLaunch,
  busy,
}: {
  path: string;
  robot: string;
  version: string;
  /** Start the (stopped) robot with a custom launch; absent for viewers and running robots. */
  onLaunch?: (launch: { package: string; launchFile: string }) => void;
  busy: boolean;
}) {
  const [modes, setModes] = useState<Mode[] | null>(null);
  const [launchPackage, setLaunchPackage] = useState('');
  const [launchFile, setLaunchFile] = useState('');
  const [lines, setLines] = useState<string[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [refreshed, setRefreshed] = useState(0);
  const base = `${path}/${encodeURIComponent(robot)}`;
  useEffect(() => {
    const controller = new AbortController();
    Promise.all([getJson(`${base}/modes`, controller.signal), getJson(`${base}/logs`, controller.signal)])
      .then(([m, l]) => {
        setModes(m.modes ?? []);
        setLines(l.lines ?? []);
        setError(null);
      })
      .catch((e) => controller.signal.aborted || setError(e instanceof ApiError ? e.message : String(e)));
    return () => controller.abort();
  }, [base, version, refreshed]);
  return (
    <Section title={`Robot ${robot}`}>
      <ErrorBanner error={error} />
      <h3>Modes and launch files</h3>
      <table aria-label={`Modes of ${robot}`}>
        <thead>
          <tr>
            <th scope="col">Mode</th>
            <th scope="col">Package</th>
            <th scope="col">Launch file</th>
            <th scope="col">Arguments</th>
          </tr>
        </thead>
        <tbody>
          {(modes ?? []).map((m) => (
            <tr key={m.name} data-mode={m.name}>
              <td>{m.name}</td>
              <td>{m.package}</td>
              <td>{m.launchFile}</td>
              <td class="small">
                {Object.entries(m.args)
                  .map(([k, v]) => `${k}:=${v}`)
                  .join(' ')}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {onLaunch ? (
        <form
          class="inline-form"
          onSubmit={(e) => {
            e.preventDefault();
            if (!busy) onLaunch({ package: launchPackage.trim(), launchFile: launchFile.trim() });
          }}
        >
          <label>
            Launch package{' '}
            <input value={launchPackage} required size={14} list={`packages-${robot}`} onInput={(e) => setLaunchPackage((e.target as HTMLInputElement).value)} />
          </label>
          <datalist id={`packages-${robot}`}>
            {[...new Set((modes ?? []).map((m) => m.package).filter(Boolean))].map((p) => (
              <option key={p} value={p} />
            ))}
          </datalist>
          <label>
            Launch file <input value={launchFile} required size={14} placeholder="arm.launch" onInput={(e) => setLaunchFile((e.target as HTMLInputElement).value)} />
          </label>
          <button type="submit" aria-disabled={busy ? 'true' : undefined} aria-label={`Start ${robot} with this launch file`}>
            Start with this launch file
          </button>
          <span class="muted small">The runtime allows custom launches from its allowed launch packages only; the row's launch arguments apply.</span>
        </form>
      ) : null}
      <h3>Log</h3>
      <div class="actions">
        <button type="button" onClick={() => setRefreshed((n) => n + 1)} aria-label={`Refresh the log of ${robot}`}>
          Refresh
        </button>
      </div>
      <pre class="log" data-testid={`robot-log-${robot}`} tabIndex={0} aria-label={`Log of ${robot}`}>
        {lines === null ? 'Loading…' : lines.length ? lines.join('\n') : '(no output yet)'}
      </pre>
    </Section>
  );
}

/** The robots on one Node's host, read from its agent; admins start, stop, switch and reset them. */
function Robots({ node, session }: { node: KubeObject; session: Session }) {
  const [robots, setRobots] = useState<Robot[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const [modes, setModes] = useState<Record<string, string>>({});
  const [argTexts, setArgTexts] = useState<Record<string, string>>({});
  const [details, setDetails] = useState<string | null>(null);
  const [acted, setActed] = useState(0);
  const [live, setLive] = useState<string | null>(null);
  const path = robotsPath(node);
  // Followed: the agent streams the list again after every change of a robot's state
  // (the embodied runtime's WatchRobots), whoever made it (this page, the CLI, a task).
  useEffect(
    () =>
      followLines(
        `${path}?watch=1`,
        (line) => {
          if (line.error) {
            setLive(`robots: ${line.error}`);
            return;
          }
          setRobots(line.items ?? []);
          setLive(null);
        },
        (reason) => setLive(`robots: ${reason}; reconnecting`),
      ),
    [path],
  );

  const act = async (robot: Robot, action: string, launch?: { package: string; launchFile: string }) => {
    setBusy(robot.id);
    setError(null);
    try {
      const mode = modes[robot.id]?.trim();
      const parsed = parseArgs(argTexts[robot.id] ?? '');
      if ('error' in parsed) throw new Error(parsed.error);
      const body: Record<string, unknown> = {};
      // A custom launch replaces the mode.
      if (launch) {
        body.package = launch.package;
        body.launchFile = launch.launchFile;
      } else if (mode) body.mode = mode;
      if (Object.keys(parsed.args).length && (action === 'start' || action === 'switch')) body.args = parsed.args;
      const updated: Robot = await sendJson('POST', `${path}/${encodeURIComponent(robot.id)}/${action}`, body);
      setRobots((rs) => rs.map((r) => (r.id === updated.id ? updated : r)));
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(null);
      setActed((n) => n + 1);
    }
  };

  return (
    <Section title={`Robots on ${node.metadata.name}`}>
      <ErrorBanner error={error} />
      {live ? (
        <p class="muted" data-testid="robots-live">
          {live}
        </p>
      ) : null}
      <table aria-label={`Robots on ${node.metadata.name}`}>
        <thead>
          <tr>
            <th scope="col">Robot</th>
            <th scope="col">Type</th>
            <th scope="col">Backend</th>
            <th scope="col">State</th>
            <th scope="col">Mode</th>
            <th scope="col">Message</th>
            <th scope="col">Details</th>
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
              <td>
                <button type="button" aria-pressed={details === r.id} onClick={() => setDetails(details === r.id ? null : r.id)} aria-label={`Modes and log of ${r.id}`}>
                  Modes and log
                </button>
              </td>
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
                  {/* One button starts and stops (so the focus stays on it), Switch
                      while running, Reset always. */}
                  {r.state === 'RUNNING' ? (
                    <ActionButton busy={busy === r.id} onClick={() => act(r, 'stop')} aria-label={`Stop ${r.id}`}>
                      Stop
                    </ActionButton>
                  ) : (
                    <ActionButton busy={busy === r.id} onClick={() => act(r, 'start')} aria-label={`Start ${r.id}`}>
                      Start
                    </ActionButton>
                  )}
                  {r.state === 'RUNNING' ? (
                    <ActionButton busy={busy === r.id} onClick={() => act(r, 'switch')} aria-label={`Switch ${r.id} to the mode`}>
                      Switch
                    </ActionButton>
                  ) : null}
                  <ActionButton busy={busy === r.id} onClick={() => act(r, 'reset')} aria-label={`Reset ${r.id}`}>
                    Reset
                  </ActionButton>
                </td>
              ) : null}
            </tr>
          ))}
        </tbody>
      </table>
      {details ? (
        <RobotDetails
          path={path}
          robot={details}
          version={`${acted}/${robotVersion(robots.find((r) => r.id === details))}`}
          onLaunch={
            session.canWrite && robots.find((r) => r.id === details)?.state === 'STOPPED'
              ? (launch) => act(robots.find((r) => r.id === details)!, 'start', launch)
              : undefined
          }
          busy={busy === details}
        />
      ) : null}
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
  const [live, setLive] = useState<string | null>(null);
  const path = `/rlark/v1/namespaces/${encodeURIComponent(node.metadata.namespace ?? '')}/nodes/${encodeURIComponent(node.metadata.name)}/cameras`;
  // Followed: the agent streams the list again whenever a camera opens, closes, fails or
  // recovers (the embodied runtime's WatchCameras), whoever made the change.
  useEffect(
    () =>
      followLines(
        `${path}?watch=1`,
        (line) => {
          if (line.error) {
            setLive(`cameras: ${line.error}`);
            return;
          }
          setCameras(line.items ?? []);
          setLive(null);
        },
        (reason) => setLive(`cameras: ${reason}; reconnecting`),
      ),
    [path],
  );
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
      {live ? (
        <p class="muted" data-testid="cameras-live">
          {live}
        </p>
      ) : null}
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
                    <ActionButton busy={busy === c.id} onClick={() => act(c, 'close')} aria-label={`Close camera ${c.id}`}>
                      Close
                    </ActionButton>
                  ) : (
                    <ActionButton busy={busy === c.id} onClick={() => act(c, 'open')} aria-label={`Open camera ${c.id}`}>
                      Open
                    </ActionButton>
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
