import { describe, expect, it } from 'vitest';
import { backoff, boundaryOf, MjpegParser } from './mjpeg';

const enc = new TextEncoder();
const part = (body: string) => `--rlarkframe\r\nContent-Type: image/jpeg\r\nContent-Length: ${enc.encode(body).length}\r\n\r\n${body}\r\n`;
const text = (frames: Uint8Array[]) => frames.map((f) => new TextDecoder().decode(f));

describe('MjpegParser', () => {
  it('cuts frames by their Content-Length, across chunk borders', () => {
    const stream = enc.encode(part('JPEG1') + part('JP\r\n\r\nEG2') + part('x'));
    const parser = new MjpegParser('rlarkframe');
    const frames: Uint8Array[] = [];
    for (let i = 0; i < stream.length; i += 7) frames.push(...parser.push(stream.subarray(i, i + 7)));
    expect(text(frames)).toEqual(['JPEG1', 'JP\r\n\r\nEG2', 'x']);
  });

  it('waits for a whole frame', () => {
    const parser = new MjpegParser('rlarkframe');
    const whole = enc.encode(part('ABCDEFGH'));
    expect(parser.push(whole.subarray(0, whole.length - 6))).toEqual([]);
    expect(text(parser.push(whole.subarray(whole.length - 6)))).toEqual(['ABCDEFGH']);
  });

  it('refuses a stream that is not the expected multipart', () => {
    expect(() => new MjpegParser('rlarkframe').push(enc.encode('HTTP garbage\r\n\r\n'))).toThrow(/boundary/);
    expect(() => new MjpegParser('rlarkframe').push(enc.encode('--rlarkframe\r\nContent-Type: image/jpeg\r\n\r\nxx'))).toThrow(/Content-Length/);
  });

  it('reads the boundary and backs off up to 10 s', () => {
    expect(boundaryOf('multipart/x-mixed-replace; boundary=rlarkframe')).toBe('rlarkframe');
    expect(boundaryOf('multipart/x-mixed-replace; boundary="a b"')).toBe('a b');
    expect(boundaryOf('image/jpeg')).toBeNull();
    expect([0, 1, 2, 3, 4, 9].map(backoff)).toEqual([1000, 2000, 4000, 8000, 10_000, 10_000]);
  });
});
