import { describe, expect, it } from 'vitest';
import type { Session } from './api';
import { mayReach, parsePort, proxyPath } from './proxy';

const session = (role: Session['role'], user = 'vera', groups: string[] = []): Session => ({ user, groups, role, canWrite: role === 'admin', csrfToken: null, expiresAt: null, loginWith: 'token' });
const job = (access: unknown[]) => ({ metadata: { name: 'j' }, spec: { access } });

describe('task proxy links', () => {
  it('address replica 0 by the short form and others by index', () => {
    expect(proxyPath('rlark-a', 'train-learner', 0, 6006)).toBe('/rlark/v1/namespaces/rlark-a/tasks/train-learner/proxy/6006/');
    expect(proxyPath('rlark-a', 'train-learner', 2, 8265)).toBe('/rlark/v1/namespaces/rlark-a/tasks/train-learner/replicas/2/proxy/8265/');
  });

  it('are offered to admins and to the users and groups the Job grants', () => {
    expect(mayReach(session('admin', 'root'), undefined)).toBe(true);
    expect(mayReach(session('viewer'), undefined)).toBe(false);
    expect(mayReach(session('viewer'), job([{ user: 'tess' }]))).toBe(false);
    expect(mayReach(session('viewer'), job([{ user: 'vera' }]))).toBe(true);
    expect(mayReach(session('viewer', 'vera', ['ml']), job([{ group: 'ml' }]))).toBe(true);
  });

  it('take ports 1-65535 only', () => {
    expect(parsePort('6006')).toBe(6006);
    expect(parsePort(' 80 ')).toBe(80);
    for (const bad of ['', '0', '65536', '-1', '60a', '1e3']) expect(parsePort(bad)).toBeNull();
  });
});
