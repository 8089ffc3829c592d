import { describe, expect, it } from 'vitest';
import { joinCommand } from './Admin';

describe('joinCommand', () => {
  it('matches what rlark token create prints', () => {
    expect(joinCommand('https://10.0.0.1:8443', 'abc123.def', 'sha256:00ff')).toBe('rlark join --server https://10.0.0.1:8443 --token abc123.def --ca-hash sha256:00ff');
    expect(joinCommand('https://h:1', 't', 'sha256:1', 'edge-1')).toContain(' --cluster-id edge-1');
  });

  it('quotes words the shell would split', () => {
    expect(joinCommand('https://h:1', "a b'c", 'sha256:1')).toContain(`--token 'a b'\\''c'`);
  });
});
