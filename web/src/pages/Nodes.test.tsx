import { cleanup, render, waitFor } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Session } from '../api';
import { Nodes } from './Nodes';

const node = {
  metadata: { name: 'gpu-0', namespace: 'rlark-gpu', labels: { 'rlark.io/cluster-id': 'gpu' }, resourceVersion: '5' },
  spec: { agentType: 'Raw' },
  status: { phase: 'Online', allocatable: { cpu: '8', 'nvidia.com/gpu': '2' } },
};

/** fetch answering the list, then a watch that stays open. */
function fakeFetch() {
  return vi.fn(async (url: string) => {
    if (String(url).includes('watch=1')) {
      return new Response(new ReadableStream({ start() {} }), { status: 200 });
    }
    return new Response(JSON.stringify({ items: [node], metadata: { resourceVersion: '5' } }), { status: 200 });
  });
}

const session = (canWrite: boolean): Session => ({
  user: canWrite ? 'admin' : 'vera',
  groups: [],
  role: canWrite ? 'admin' : 'viewer',
  canWrite,
  csrfToken: 'x',
  expiresAt: null,
});

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe('Nodes', () => {
  it('offers cordon to admins', async () => {
    vi.stubGlobal('fetch', fakeFetch());
    const { findByRole } = render(<Nodes session={session(true)} />);
    expect(await findByRole('button', { name: 'Cordon node gpu-0' })).toBeTruthy();
  });

  it('shows viewers no write buttons', async () => {
    vi.stubGlobal('fetch', fakeFetch());
    const { findByText, queryAllByRole } = render(<Nodes session={session(false)} />);
    await findByText('gpu-0');
    await waitFor(() => expect(queryAllByRole('button')).toHaveLength(0));
  });
});
