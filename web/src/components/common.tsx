import { ComponentChildren, JSX } from 'preact';
import { KubeObject } from '../api';

export function Phase({ phase }: { phase?: string }) {
  const p = phase ?? 'Pending';
  return <span class={`phase phase-${p.toLowerCase()}`}>{p}</span>;
}

export function ErrorBanner({ error }: { error: string | null | undefined }) {
  if (!error) return null;
  return (
    <p class="error" role="alert">
      {error}
    </p>
  );
}

export function Section({ title, children }: { title: string; children: ComponentChildren }) {
  return (
    <section aria-label={title}>
      <h2>{title}</h2>
      {children}
    </section>
  );
}

export function age(o: KubeObject): string {
  const t = o.metadata.creationTimestamp;
  if (!t) return '';
  const s = Math.max(0, (Date.now() - Date.parse(t)) / 1000);
  if (s < 120) return `${Math.floor(s)}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

export function Conditions({ conditions }: { conditions?: any[] }) {
  if (!conditions?.length) return <p class="muted">No conditions.</p>;
  return (
    <table>
      <thead>
        <tr>
          <th scope="col">Type</th>
          <th scope="col">Status</th>
          <th scope="col">Reason</th>
          <th scope="col">Message</th>
          <th scope="col">Since</th>
        </tr>
      </thead>
      <tbody>
        {conditions.map((c) => (
          <tr key={c.type}>
            <td>{c.type}</td>
            <td>{c.status}</td>
            <td>{c.reason}</td>
            <td>{c.message}</td>
            <td>{c.lastTransitionTime}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** A button for an action that takes a while. While `busy` it is marked
 * `aria-disabled` and ignores presses, but stays focusable: a `disabled` button loses the
 * keyboard focus (to the page's top) the moment it is pressed. */
export function ActionButton({ busy, onClick, children, ...rest }: { busy: boolean; onClick: () => void; children: ComponentChildren } & Omit<JSX.HTMLAttributes<HTMLButtonElement>, 'onClick' | 'disabled'>) {
  return (
    <button type="button" {...rest} aria-disabled={busy ? 'true' : undefined} onClick={() => busy || onClick()}>
      {children}
    </button>
  );
}
