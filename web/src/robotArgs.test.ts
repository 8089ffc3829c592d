import { describe, expect, it } from 'vitest';
import { parseArgs } from './robotArgs';

describe('parseArgs', () => {
  it('reads NAME=VALUE words', () => {
    expect(parseArgs('')).toEqual({ args: {} });
    expect(parseArgs(' target=0.1,0.2  speed=2 ')).toEqual({ args: { target: '0.1,0.2', speed: '2' } });
    expect(parseArgs('url=a=b')).toEqual({ args: { url: 'a=b' } });
  });

  it('names a word that is not NAME=VALUE', () => {
    expect(parseArgs('speed')).toEqual({ error: 'launch argument "speed" must be NAME=VALUE' });
    expect(parseArgs('=2')).toHaveProperty('error');
  });
});
