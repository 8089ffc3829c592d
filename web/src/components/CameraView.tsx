import { useEffect, useState } from 'preact/hooks';
import { toApiError } from '../api';
import { backoff, boundaryOf, MjpegParser } from '../mjpeg';

export function cameraStreamUrl(namespace: string, node: string, camera: string, fps = 5): string {
  return `/rlark/v1/namespaces/${encodeURIComponent(namespace)}/nodes/${encodeURIComponent(node)}/cameras/${encodeURIComponent(camera)}/stream?fps=${fps}`;
}

/** A camera's live view. The server relays its MJPEG stream from the agent; the page reads
 * it with fetch, shows each JPEG part as it arrives, and when the stream ends or cannot
 * start (the camera closed, the agent reconnecting) says why and opens it again by itself,
 * after 1 s, doubling to at most 10 s, back to 1 s once frames flow. */
export function CameraView({ namespace, node, camera }: { namespace: string; node: string; camera: string }) {
  const url = cameraStreamUrl(namespace, node, camera);
  const [frame, setFrame] = useState<string | null>(null);
  const [frames, setFrames] = useState(0);
  const [status, setStatus] = useState('connecting');

  useEffect(() => {
    const controller = new AbortController();
    let shown: string | null = null;
    let attempt = 0;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const show = (jpeg: Uint8Array) => {
      const next = URL.createObjectURL(new Blob([jpeg as BlobPart], { type: 'image/jpeg' }));
      if (shown) URL.revokeObjectURL(shown);
      shown = next;
      setFrame(next);
      setFrames((n) => n + 1);
    };
    const retry = (why: string) => {
      if (controller.signal.aborted) return;
      const delay = backoff(attempt++);
      setStatus(`${why}; opening it again in ${Math.round(delay / 1000)} s`);
      timer = setTimeout(open, delay);
    };
    const open = async () => {
      try {
        const response = await fetch(url, { credentials: 'same-origin', signal: controller.signal });
        if (!response.ok) return retry((await toApiError(response)).message);
        const boundary = boundaryOf(response.headers.get('Content-Type'));
        if (!boundary || !response.body) return retry(`camera ${camera}: the server did not answer with an MJPEG stream`);
        const parser = new MjpegParser(boundary);
        const reader = response.body.getReader();
        let live = false;
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          for (const jpeg of parser.push(value)) {
            if (!live) {
              live = true;
              attempt = 0;
              setStatus('live');
            }
            show(jpeg);
          }
        }
        retry(`camera ${camera}: the stream ended`);
      } catch (e) {
        if (!controller.signal.aborted) retry(`camera ${camera}: ${e instanceof Error ? e.message : String(e)}`);
      }
    };
    setFrame(null);
    setFrames(0);
    setStatus('connecting');
    open();
    return () => {
      controller.abort();
      clearTimeout(timer);
      if (shown) URL.revokeObjectURL(shown);
    };
  }, [url]);

  return (
    <div class="camera-view">
      <p class="muted" role="status" data-testid={`camera-status-${camera}`}>
        {status}
      </p>
      {frame ? (
        <img src={frame} alt={`Live view of camera ${camera} on ${node}`} class="camera" data-testid={`camera-${camera}`} data-frames={frames} />
      ) : null}
    </div>
  );
}
