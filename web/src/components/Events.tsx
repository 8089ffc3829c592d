import { useWatch } from '../watch';
import { ErrorBanner } from './common';

/** The core Events about one object, live. */
export function Events({ kind, name, namespace }: { kind: string; name: string; namespace?: string }) {
  let selector = `involvedObject.kind=${kind},involvedObject.name=${name}`;
  if (namespace) selector += `,involvedObject.namespace=${namespace}`;
  const events = useWatch('/api/v1/events', { fieldSelector: selector });
  const items = [...events.items].sort((a: any, b: any) =>
    String(a.lastTimestamp ?? a.eventTime ?? '').localeCompare(String(b.lastTimestamp ?? b.eventTime ?? '')),
  );
  return (
    <div>
      <ErrorBanner error={events.error} />
      {events.loaded && items.length === 0 ? <p class="muted">No events.</p> : null}
      {items.length > 0 ? (
        <table aria-label={`Events of ${kind} ${name}`}>
          <thead>
            <tr>
              <th scope="col">Type</th>
              <th scope="col">Reason</th>
              <th scope="col">Message</th>
              <th scope="col">Count</th>
              <th scope="col">Last seen</th>
            </tr>
          </thead>
          <tbody>
            {items.map((e: any) => (
              <tr key={e.metadata.uid ?? e.metadata.name}>
                <td>{e.type}</td>
                <td>{e.reason}</td>
                <td>{e.message}</td>
                <td>{e.count ?? 1}</td>
                <td>{e.lastTimestamp ?? e.eventTime}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </div>
  );
}
