import { useEffect, useState } from 'preact/hooks';
import { toApiError } from '../api';

export function cameraStreamUrl(namespace: string, node: string, camera: string, fps = 5): string {
  return `/rlark/v1/namespaces/${encodeURIComponent(namespace)}/nodes/${encodeURIComponent(node)}/cameras/${encodeURIComponent(camera)}/stream?fps=${fps}`;
}

/** A camera's live view: the server relays its MJPEG stream from the agent into an `<img>`. */
export function CameraView({ namespace, node, camera }: { namespace: string; node: string; camera: string }) {
  const url = cameraStreamUrl(namespace, node, camera);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => setError(null), [url]);
  if (error) {
    return (
      <p class="error" role="alert">
        {error}
      </p>
    );
  }
  return (
    <img
      src={url}
      alt={`Live view of camera ${camera} on ${node}`}
      class="camera"
      data-testid={`camera-${camera}`}
      onError={async () => {
        // The stream failed to start: ask once more for the reason (a Status object).
        try {
          const response = await fetch(url, { credentials: 'same-origin' });
          if (response.ok) {
            response.body?.cancel();
            setError(`camera ${camera}: the stream could not be shown`);
          } else {
            setError((await toApiError(response)).message);
          }
        } catch (e) {
          setError(String(e));
        }
      }}
    />
  );
}
