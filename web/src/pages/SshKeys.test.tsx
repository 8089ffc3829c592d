import { cleanup, fireEvent, render, waitFor } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Session, setCsrfToken } from '../api';
import { sshCommand, SshKey, SshKeys } from './SshKeys';

const key = (id: string, user: string): SshKey => ({
  id,
  user,
  groups: [],
  publicKey: 'ssh-ed25519 AAAA',
  fingerprint: `SHA256:${id}`,
  comment: `${user}@laptop`,
  createdAt: '2026-12-02T20:00:00Z',
  registeredWith: { kind: 'token', id: 'rlk-abc' },
});

const session = (role: 'admin' | 'viewer', user: string, loginWith: 'token' | 'link'): Session => ({
  user,
  groups: [],
  role,
  canWrite: role === 'admin',
  csrfToken: 'csrf',
  expiresAt: null,
  loginWith,
});

/** The routes the page calls, recording writes; the change stream tells of every write
 * (as the server's does), which is how the page learns to read the keys again. */
function fakeServer(keys: SshKey[], info: object) {
  const calls: { method: string; url: string; body?: string }[] = [];
  const streams: ReadableStreamDefaultController<Uint8Array>[] = [];
  const push = (line: object) => streams.forEach((c) => c.enqueue(new TextEncoder().encode(JSON.stringify(line) + '\n')));
  const fetch = vi.fn(async (url: string, init?: RequestInit) => {
    const method = init?.method ?? 'GET';
    calls.push({ method, url: String(url), body: init?.body as string | undefined });
    if (url === '/rlark/v1/console/changes?resources=sshkeys') {
      return new Response(
        new ReadableStream<Uint8Array>({
          start(c) {
            streams.push(c);
            c.enqueue(new TextEncoder().encode('{"type":"BOOKMARK","revision":"1"}\n'));
          },
        }),
        { status: 200 },
      );
    }
    if (method !== 'GET') setTimeout(() => push({ type: 'CHANGED', resource: 'sshkeys', revision: '2' }), 0);
    if (url === '/rlark/v1/sshinfo') return new Response(JSON.stringify(info), { status: 200 });
    if (url === '/rlark/v1/sshkeys' && method === 'GET') return new Response(JSON.stringify({ items: keys }), { status: 200 });
    if (url === '/rlark/v1/sshkeys' && method === 'POST') {
      keys.push(key('new', 'vera'));
      return new Response(JSON.stringify(key('new', 'vera')), { status: 201 });
    }
    if (String(url).startsWith('/rlark/v1/sshkeys/') && method === 'DELETE') {
      const id = String(url).split('/').pop();
      keys.splice(keys.findIndex((k) => k.id === id), 1);
      return new Response(JSON.stringify(key(id!, 'vera')), { status: 200 });
    }
    return new Response('{"message":"unexpected"}', { status: 500 });
  });
  return { fetch, calls };
}

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe('SshKeys', () => {
  it('registers and removes the user own keys, with the CSRF token', async () => {
    const server = fakeServer([key('k1', 'vera')], { enabled: true, port: 2222, hostKeyFingerprint: 'SHA256:host', caPublicKey: 'ssh-ed25519 CA' });
    vi.stubGlobal('fetch', server.fetch);
    vi.stubGlobal('confirm', () => true);
    setCsrfToken('csrf');
    const { getByLabelText, getByRole, findByTestId, findByRole } = render(<SshKeys session={session('viewer', 'vera', 'token')} />);
    expect((await findByTestId('ssh-command')).textContent).toBe(`ssh -p 2222 TASK@${window.location.hostname}`);
    await findByRole('button', { name: 'Remove SSH key k1 of vera' });
    fireEvent.input(getByLabelText(/Public key/), { target: { value: ' ssh-ed25519 AAAAnew vera@laptop \n' } });
    fireEvent.click(getByRole('button', { name: 'Register key' }));
    await findByRole('button', { name: 'Remove SSH key new of vera' });
    const post = server.calls.find((c) => c.method === 'POST')!;
    expect(JSON.parse(post.body!)).toEqual({ publicKey: 'ssh-ed25519 AAAAnew vera@laptop' });
    expect((server.fetch.mock.calls.find((c) => c[1]?.method === 'POST')![1]!.headers as Record<string, string>)['X-Rlark-CSRF']).toBe('csrf');
    fireEvent.click(getByRole('button', { name: 'Remove SSH key k1 of vera' }));
    await waitFor(() => expect(server.calls.some((c) => c.method === 'DELETE' && c.url === '/rlark/v1/sshkeys/k1')).toBe(true));
    await waitFor(() => expect(document.querySelector('[data-ssh-key="k1"]')).toBeNull());
  });

  it('offers removal of others keys to admins only', async () => {
    vi.stubGlobal('fetch', fakeServer([key('k1', 'tess')], { enabled: false, caPublicKey: 'x' }).fetch);
    const viewer = render(<SshKeys session={session('viewer', 'vera', 'token')} />);
    await viewer.findByText('tess');
    expect(viewer.queryByRole('button', { name: /Remove SSH key/ })).toBeNull();
    expect(viewer.getByTestId('ssh-disabled')).toBeTruthy();
    cleanup();
    const admin = render(<SshKeys session={session('admin', 'root', 'token')} />);
    await admin.findByRole('button', { name: 'Remove SSH key k1 of tess' });
  });

  it('explains that a link session cannot register keys, and disables the form', async () => {
    vi.stubGlobal('fetch', fakeServer([], { enabled: false, caPublicKey: 'x' }).fetch);
    const { findByTestId, getByLabelText, getByRole } = render(<SshKeys session={session('admin', 'admin', 'link')} />);
    expect((await findByTestId('ssh-key-needs-token')).textContent).toContain('rlark token create --user admin');
    expect((getByLabelText(/Public key/) as HTMLTextAreaElement).disabled).toBe(true);
    expect((getByRole('button', { name: 'Register key' }) as HTMLButtonElement).disabled).toBe(true);
  });

  it('prints the ssh command without -p for port 22', () => {
    expect(sshCommand('rlark.example', 22)).toBe('ssh TASK@rlark.example');
    expect(sshCommand('rlark.example', 2222, 'menu')).toBe('ssh -p 2222 menu@rlark.example');
  });
});
