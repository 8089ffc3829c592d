// A terminal in a running replica: xterm.js over the exec WebSocket
// (`/rlark/v1/namespaces/NS/pods/POD/exec`, Kubernetes' `v4.channel.k8s.io` protocol: each
// binary message starts with its channel, 0 stdin, 1 stdout, 2 stderr, 3 the final
// status, 4 terminal size). Admins only; the session cookie authenticates the handshake.
// This module is loaded on demand, so xterm.js is not part of the first page load.
import { Terminal as XTerm } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { useEffect, useRef, useState } from 'preact/hooks';
import { withConstructedStyles } from '../cspStyles';

const STDIN = 0;
const STDOUT = 1;
const STDERR = 2;
const ERROR = 3;
const RESIZE = 4;

export function execUrl(location: Location, namespace: string, pod: string, command: string[]): string {
  const q = new URLSearchParams();
  for (const part of command) q.append('command', part);
  q.set('stdin', 'true');
  q.set('stdout', 'true');
  q.set('stderr', 'true');
  q.set('tty', 'true');
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${scheme}//${location.host}/rlark/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(pod)}/exec?${q}`;
}

/** The text of a channel-3 status message: empty for success. */
export function exitMessage(status: string): string {
  try {
    const s = JSON.parse(status);
    if (s.status === 'Success') return '';
    return s.message ?? status;
  } catch {
    return status;
  }
}

export default function Terminal({ namespace, pod, command = ['/bin/sh'] }: { namespace: string; pod: string; command?: string[] }) {
  const host = useRef<HTMLDivElement>(null);
  const [state, setState] = useState('connecting');

  useEffect(() => {
    const term = new XTerm({ convertEol: false, cursorBlink: true, fontSize: 13, rows: 24, cols: 100, screenReaderMode: true });
    // xterm.js writes its cell sizes and colours into <style> elements, which the page's
    // CSP refuses; they become constructed style sheets instead (cspStyles.ts).
    withConstructedStyles(document, () => term.open(host.current!));
    // Tab belongs to the shell (completion); Shift+Tab is left to the browser, so a
    // keyboard user can leave the terminal (to its Close button and the rest of the page).
    term.attachCustomKeyEventHandler((e) => !(e.key === 'Tab' && e.shiftKey));
    const socket = new WebSocket(execUrl(window.location, namespace, pod, command), ['v4.channel.k8s.io']);
    socket.binaryType = 'arraybuffer';
    const encoder = new TextEncoder();
    const decoder = new TextDecoder();
    const send = (channel: number, data: Uint8Array) => {
      if (socket.readyState !== WebSocket.OPEN) return;
      const frame = new Uint8Array(data.length + 1);
      frame[0] = channel;
      frame.set(data, 1);
      socket.send(frame);
    };
    const resize = () => send(RESIZE, encoder.encode(JSON.stringify({ Width: term.cols, Height: term.rows })));
    socket.onopen = () => {
      setState('connected');
      resize();
      term.focus();
    };
    socket.onmessage = (event) => {
      const bytes = new Uint8Array(event.data as ArrayBuffer);
      if (bytes.length === 0) return;
      const body = bytes.subarray(1);
      if (bytes[0] === STDOUT || bytes[0] === STDERR) term.write(body);
      else if (bytes[0] === ERROR) {
        const message = exitMessage(decoder.decode(body));
        setState(message ? `ended: ${message}` : 'ended');
      }
    };
    socket.onerror = () => setState('the connection failed (is the replica running?)');
    socket.onclose = (event) => setState((s) => (s.startsWith('ended') ? s : `closed${event.reason ? `: ${event.reason}` : ''}`));
    const input = term.onData((data) => send(STDIN, encoder.encode(data)));
    const sized = term.onResize(resize);
    return () => {
      input.dispose();
      sized.dispose();
      socket.close();
      term.dispose();
    };
  }, [namespace, pod, command.join('\u0000')]);

  return (
    <div>
      <p class="muted" role="status" data-testid="terminal-state">
        {pod}: {state}
      </p>
      <p class="muted small">Tab completes in the shell; Shift+Tab leaves the terminal.</p>
      <div ref={host} class="terminal" data-testid="terminal" />
    </div>
  );
}
