import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { sendJson } from '../api';
import { ActionButton } from './common';

/** What `POST /rlark/v1/console/proxy-tickets` takes (docs/api.md). */
export interface TaskApp {
  namespace: string;
  task: string;
  replica?: number;
  port: number;
  path?: string;
}

/** Ask the server for a one-time link to the task app on the task proxy's own origin
 * (docs/ssh.md): the app runs there, not on the console's origin, so its scripts cannot act
 * as the console's user. */
export async function proxyTicket(app: TaskApp): Promise<string> {
  const answer = await sendJson<{ url: string }>('POST', '/rlark/v1/console/proxy-tickets', app);
  return answer.url;
}

/** A button that opens a task's web app in a new tab, on the task proxy's origin: the tab is
 * opened at once (so no popup blocker sees a window opened after a network round trip),
 * cut from this page (`opener = null`, as rel=noopener), then sent to the one-time link. */
export function TaskAppButton({ app, children, testId }: { app: TaskApp; children: ComponentChildren; testId?: string }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const open = async () => {
    setBusy(true);
    setError(null);
    const tab = window.open('about:blank', '_blank');
    if (tab) tab.opener = null;
    try {
      const url = await proxyTicket(app);
      if (tab) tab.location.replace(url);
      else window.open(url, '_blank', 'noopener,noreferrer');
    } catch (e) {
      tab?.close();
      setError(e instanceof Error ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <span>
      <ActionButton busy={busy} onClick={open} data-testid={testId}>
        {children}
      </ActionButton>
      {error ? (
        <span class="error" role="alert">
          {' '}
          {error}
        </span>
      ) : null}
    </span>
  );
}
