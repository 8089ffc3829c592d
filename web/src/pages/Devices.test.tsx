import { cleanup, fireEvent, render, waitFor } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Session } from '../api';
import { Devices } from './Devices';

const node = {
  metadata: { name: 'vm-edge', namespace: 'rlark-edge', labels: { 'rlark.io/cluster-id': 'edge' }, resourceVersion: '5' },
  status: {
    devices: [
      { id: 'robot-arm-0', resource: 'rlinf.io/robot-sim-arm', health: 'Healthy' },
      { id: 'camera-cam-0', resource: 'rlinf.io/camera-sim', health: 'Healthy' },
    ],
  },
};
const robot = (state: string, mode = '') => ({ id: 'arm-0', type: 'sim-arm', backend: 'sim', state, mode, message: '', ownerPid: 0 });
const camera = (state: string) => ({ id: 'cam-0', name: 'cam-0', type: 'sim', state, width: 64, height: 48, fps: 10 });

/** The Node list and watch, and the robots and cameras streams, which the test feeds. */
function fakeServer() {
  const streams = new Map<string, ReadableStreamDefaultController<Uint8Array>>();
  const push = (kind: 'robots' | 'cameras', line: object) => streams.get(kind)!.enqueue(new TextEncoder().encode(JSON.stringify(line) + '\n'));
  const fetch = vi.fn(async (url: string, _init?: RequestInit) => {
    const u = String(url);
    for (const kind of ['robots', 'cameras'] as const) {
      if (u === `/rlark/v1/namespaces/rlark-edge/nodes/vm-edge/${kind}?watch=1`) {
        return new Response(new ReadableStream<Uint8Array>({ start: (c) => void streams.set(kind, c) }), { status: 200 });
      }
    }
    if (u.includes('watch=1')) return new Response(new ReadableStream({ start() {} }), { status: 200 });
    if (u.startsWith('/apis/rlinf.io/v1alpha1/nodes')) return new Response(JSON.stringify({ items: [node], metadata: { resourceVersion: '5' } }), { status: 200 });
    return new Response('{"message":"unexpected"}', { status: 500 });
  });
  return { fetch, push, streams };
}

const viewer: Session = { user: 'vera', groups: [], role: 'viewer', canWrite: false, csrfToken: null, expiresAt: null, loginWith: 'token' };

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe('Devices', () => {
  it('shows robot and camera states as the agent pushes them, without reading again', async () => {
    const server = fakeServer();
    vi.stubGlobal('fetch', server.fetch);
    const { container } = render(<Devices session={viewer} />);
    await waitFor(() => expect(server.streams.size).toBe(2));
    const cell = (selector: string) => container.querySelector(selector)?.textContent;
    server.push('robots', { items: [robot('STOPPED')] });
    server.push('cameras', { items: [camera('CLOSED')] });
    await waitFor(() => expect(cell('tr[data-robot="arm-0"] [data-testid="robot-state"]')).toBe('STOPPED'));
    expect(cell('tr[data-camera="cam-0"] [data-testid="camera-state"]')).toBe('CLOSED');
    server.push('robots', { items: [robot('RUNNING', 'teleop')] });
    server.push('cameras', { items: [camera('OPEN')] });
    await waitFor(() => expect(cell('tr[data-robot="arm-0"] [data-testid="robot-mode"]')).toBe('teleop'));
    expect(cell('tr[data-robot="arm-0"] [data-testid="robot-state"]')).toBe('RUNNING');
    await waitFor(() => expect(cell('tr[data-camera="cam-0"] [data-testid="camera-state"]')).toBe('OPEN'));
    // Each list was asked for once: the changes came on the streams.
    const asked = server.fetch.mock.calls.map((c) => String((c as unknown[])[0])).filter((u) => u.includes('/nodes/vm-edge/'));
    expect(asked.sort()).toEqual(['/rlark/v1/namespaces/rlark-edge/nodes/vm-edge/cameras?watch=1', '/rlark/v1/namespaces/rlark-edge/nodes/vm-edge/robots?watch=1']);
    // A viewer sees no device actions.
    expect(container.querySelectorAll('tr[data-robot] button, tr[data-camera] button').length).toBe(2); // "Modes and log", "View"
  });

  it('reads a shown robot\'s log again when its state is pushed', async () => {
    const server = fakeServer();
    let reads = 0;
    const base = server.fetch.getMockImplementation()!;
    server.fetch.mockImplementation(async (url: string, init?: RequestInit) => {
      const u = String(url);
      if (u.endsWith('/robots/arm-0/logs')) {
        reads += 1;
        return new Response(JSON.stringify({ robotId: 'arm-0', lines: [`read ${reads}`] }), { status: 200 });
      }
      if (u.endsWith('/robots/arm-0/modes')) return new Response(JSON.stringify({ robotId: 'arm-0', modes: [] }), { status: 200 });
      return base(url, init);
    });
    vi.stubGlobal('fetch', server.fetch);
    const { findByRole, findByTestId } = render(<Devices session={viewer} />);
    await waitFor(() => expect(server.streams.size).toBe(2));
    server.push('robots', { items: [robot('STOPPED')] });
    (await findByRole('button', { name: 'Modes and log of arm-0' })).click();
    await waitFor(async () => expect((await findByTestId('robot-log-arm-0')).textContent).toBe('read 1'));
    server.push('robots', { items: [robot('RUNNING', 'teleop')] });
    await waitFor(async () => expect((await findByTestId('robot-log-arm-0')).textContent).toBe('read 2'));
  });

  it('starts a stopped robot with a custom launch file (admins)', async () => {
    const server = fakeServer();
    const posts: { url: string; body: unknown }[] = [];
    const base = server.fetch.getMockImplementation()!;
    server.fetch.mockImplementation(async (url: string, init?: RequestInit) => {
      const u = String(url);
      if (init?.method === 'POST') {
        posts.push({ url: u, body: JSON.parse(String(init.body)) });
        return new Response(JSON.stringify(robot('RUNNING', 'rlark_sim/arm.launch')), { status: 200 });
      }
      if (u.endsWith('/robots/arm-0/logs')) return new Response(JSON.stringify({ robotId: 'arm-0', lines: [] }), { status: 200 });
      if (u.endsWith('/robots/arm-0/modes')) return new Response(JSON.stringify({ robotId: 'arm-0', modes: [{ name: 'idle', package: 'rlark_sim', launchFile: 'arm.launch', args: {} }] }), { status: 200 });
      return base(url, init);
    });
    vi.stubGlobal('fetch', server.fetch);
    const admin: Session = { ...viewer, user: 'root', role: 'admin', canWrite: true };
    const { findByRole, getByLabelText, container } = render(<Devices session={admin} />);
    await waitFor(() => expect(server.streams.size).toBe(2));
    server.push('robots', { items: [robot('STOPPED')] });
    (await findByRole('button', { name: 'Modes and log of arm-0' })).click();
    const start = await findByRole('button', { name: 'Start arm-0 with this launch file' });
    fireEvent.input(getByLabelText('Launch package'), { target: { value: 'rlark_sim' } });
    fireEvent.input(getByLabelText('Launch file'), { target: { value: ' arm.launch ' } });
    fireEvent.input(getByLabelText('Launch arguments for arm-0 (NAME=VALUE ...)'), { target: { value: 'speed=3' } });
    start.click();
    await waitFor(() => expect(posts).toHaveLength(1));
    expect(posts[0]).toEqual({ url: '/rlark/v1/namespaces/rlark-edge/nodes/vm-edge/robots/arm-0/start', body: { package: 'rlark_sim', launchFile: 'arm.launch', args: { speed: '3' } } });
    await waitFor(() => expect(container.querySelector('tr[data-robot="arm-0"] [data-testid="robot-mode"]')?.textContent).toBe('rlark_sim/arm.launch'));
    // Running: no custom launch offered.
    await waitFor(() => expect(container.querySelector('button[aria-label="Start arm-0 with this launch file"]')).toBeNull());
  });

  it('says when the runtime ends a watch', async () => {
    const server = fakeServer();
    vi.stubGlobal('fetch', server.fetch);
    const { findByTestId } = render(<Devices session={viewer} />);
    await waitFor(() => expect(server.streams.size).toBe(2));
    server.push('robots', { error: 'the embodied runtime ended the watch' });
    expect((await findByTestId('robots-live')).textContent).toBe('robots: the embodied runtime ended the watch');
  });
});
