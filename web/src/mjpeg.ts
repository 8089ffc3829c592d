// The parts of a `multipart/x-mixed-replace` JPEG stream as the server relays a camera
// (`--BOUNDARY\r\nContent-Type: image/jpeg\r\nContent-Length: N\r\n\r\n<N bytes>\r\n`,
// rlark-agent's camera_stream.rs), cut from the chunks a fetch body delivers.

export class MjpegParser {
  private buffer = new Uint8Array(0);

  constructor(private readonly boundary: string) {}

  /** Adds a chunk; returns the frames it completed (possibly none). */
  push(chunk: Uint8Array): Uint8Array[] {
    const joined = new Uint8Array(this.buffer.length + chunk.length);
    joined.set(this.buffer);
    joined.set(chunk, this.buffer.length);
    this.buffer = joined;
    const frames: Uint8Array[] = [];
    for (;;) {
      const headEnd = indexOf(this.buffer, CRLFCRLF);
      if (headEnd < 0) break;
      const head = new TextDecoder().decode(this.buffer.subarray(0, headEnd));
      if (!head.replace(/^\r\n/, '').startsWith(`--${this.boundary}`)) throw new Error(`the camera stream has no part boundary --${this.boundary}`);
      const length = /content-length:\s*(\d+)/i.exec(head);
      if (!length) throw new Error('a part of the camera stream has no Content-Length');
      const start = headEnd + CRLFCRLF.length;
      const end = start + Number(length[1]);
      if (this.buffer.length < end) break;
      frames.push(this.buffer.slice(start, end));
      this.buffer = this.buffer.slice(end);
    }
    return frames;
  }
}

/** The boundary of a `multipart/...; boundary=B` content type. */
export function boundaryOf(contentType: string | null): string | null {
  const m = /boundary="?([^";]+)"?/i.exec(contentType ?? '');
  return m ? m[1] : null;
}

/** Delay before reconnect attempt `attempt` (0-based): 1 s doubling, at most 10 s. */
export function backoff(attempt: number): number {
  return Math.min(10_000, 1000 * 2 ** attempt);
}

const CRLFCRLF = new Uint8Array([13, 10, 13, 10]);

function indexOf(haystack: Uint8Array, needle: Uint8Array): number {
  outer: for (let i = 0; i + needle.length <= haystack.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}
