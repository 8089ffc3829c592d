import { cleanup, render, waitFor } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { CameraView } from './CameraView';

const enc = new TextEncoder();
const part = (body: string) => enc.encode(`--rlarkframe\r\nContent-Type: image/jpeg\r\nContent-Length: ${body.length}\r\n\r\n${body}\r\n`);

/** A stream response that sends `parts`, then ends. */
function stream(parts: Uint8Array[]) {
  return new Response(
    new ReadableStream({
      start(c) {
        for (const p of parts) c.enqueue(p);
        c.close();
      },
    }),
    { status: 200, headers: { 'Content-Type': 'multipart/x-mixed-replace; boundary=rlarkframe' } },
  );
}

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe('CameraView', () => {
  it('shows the reason a stream cannot start, and opens it again by itself', async () => {
    let n = 0;
    const fetch = vi.fn(async () => {
      n += 1;
      if (n === 1) return new Response(JSON.stringify({ message: 'camera cam-0: not open' }), { status: 409 });
      if (n === 2) return stream([part('A'), part('B')]);
      return new Promise<Response>(() => {}); // the third attempt hangs
    });
    vi.stubGlobal('fetch', fetch);
    let blobs = 0;
    vi.stubGlobal('URL', Object.assign(Object.create(URL), { createObjectURL: () => `blob:frame-${++blobs}`, revokeObjectURL: () => {} }));
    const { getByTestId, findByTestId } = render(<CameraView namespace="rlark-edge" node="vm-edge" camera="cam-0" />);
    await waitFor(() => expect(getByTestId('camera-status-cam-0').textContent).toBe('camera cam-0: not open; opening it again in 1 s'));
    // After the backoff the stream starts; its two frames are shown, then it ends and the
    // view tries again, with the backoff reset by the frames.
    const img = await findByTestId('camera-cam-0', {}, { timeout: 3000 });
    await waitFor(() => expect(img.getAttribute('data-frames')).toBe('2'));
    expect(img.getAttribute('src')).toBe('blob:frame-2');
    await waitFor(() => expect(getByTestId('camera-status-cam-0').textContent).toBe('camera cam-0: the stream ended; opening it again in 1 s'));
    await waitFor(() => expect(fetch).toHaveBeenCalledTimes(3), { timeout: 3000 });
    expect((fetch.mock.calls[0] as unknown[])[0]).toBe('/rlark/v1/namespaces/rlark-edge/nodes/vm-edge/cameras/cam-0/stream?fps=5');
  });
});
