import { RLINF } from '../api';
import { age, ErrorBanner, Section } from '../components/common';
import { href } from '../router';
import { useWatch, useWatchOne } from '../watch';

export function Domains() {
  const domains = useWatch(`${RLINF}/domains`);
  const items = [...domains.items].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  return (
    <main>
      <h1>Domains</h1>
      <ErrorBanner error={domains.error} />
      {domains.loaded && items.length === 0 ? <p class="muted">No domains.</p> : null}
      <table aria-label="Domains">
        <thead>
          <tr>
            <th scope="col">Domain</th>
            <th scope="col">CIDR</th>
            <th scope="col">Addresses in use</th>
            <th scope="col">Age</th>
          </tr>
        </thead>
        <tbody>
          {items.map((d) => (
            <tr key={d.metadata.name}>
              <td>
                <a href={href('domains', d.metadata.name)}>{d.metadata.name}</a>
              </td>
              <td>{d.spec?.cidr}</td>
              <td>
                {d.status?.allocated ?? 0}
                {d.status?.capacity ? ` of ${d.status.capacity}` : ''}
              </td>
              <td>{age(d)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </main>
  );
}

/** A Domain: its members (from the DomainPeers of every cluster) and the traffic per path. */
export function DomainDetail({ name }: { name: string }) {
  const { object: domain, loaded, error } = useWatchOne(`${RLINF}/domains`, name);
  const peers = useWatch(`${RLINF}/domainpeers`);
  const mine = peers.items.filter((p) => p.spec?.domain === name);
  const members = mine.flatMap((p) => (p.spec?.pods ?? []).map((pod: any) => ({ ...pod, peer: p.metadata.namespace })));
  const pending = mine.flatMap((p) => (p.spec?.pending ?? []).map((pod: any) => ({ ...pod, peer: p.metadata.namespace })));
  const paths = mine.flatMap((p) => (p.status?.paths ?? []).map((path: any) => ({ ...path, from: p.metadata.namespace })));
  if (!domain) {
    return (
      <main>
        <h1>Domain {name}</h1>
        <ErrorBanner error={error} />
        {loaded ? <p>Domain {name} does not exist.</p> : <p>Loading…</p>}
      </main>
    );
  }
  return (
    <main>
      <h1>Domain {name}</h1>
      <ErrorBanner error={peers.error} />
      <dl class="facts">
        <dt>CIDR</dt>
        <dd>{domain.spec?.cidr}</dd>
        <dt>Addresses in use</dt>
        <dd>
          {domain.status?.allocated ?? 0}
          {domain.status?.capacity ? ` of ${domain.status.capacity}` : ''}
        </dd>
      </dl>
      <Section title="Members">
        {members.length === 0 ? <p class="muted">No members: no replica of a Job in this domain runs now.</p> : null}
        {members.length ? (
          <table aria-label="Members">
            <thead>
              <tr>
                <th scope="col">Replica</th>
                <th scope="col">Task</th>
                <th scope="col">Cluster</th>
                <th scope="col">Node</th>
                <th scope="col">Domain IP</th>
              </tr>
            </thead>
            <tbody>
              {members.map((m: any) => (
                <tr key={`${m.peer}/${m.uid ?? m.name}`}>
                  <td>{m.name}</td>
                  <td>{m.task ?? ''}</td>
                  <td>{m.cluster}</td>
                  <td>{m.node ?? ''}</td>
                  <td>{m.ip}</td>
                </tr>
              ))}
            </tbody>
          </table>
        ) : null}
        {pending.length ? (
          <>
            <h3>Waiting for an address</h3>
            <ul>
              {pending.map((p: any) => (
                <li key={`${p.peer}/${p.name}`}>
                  {p.name}: {p.reason} {p.message}
                </li>
              ))}
            </ul>
          </>
        ) : null}
      </Section>
      <Section title="Paths between clusters">
        {paths.length === 0 ? <p class="muted">No traffic reported yet.</p> : null}
        {paths.length ? (
          <table aria-label="Paths">
            <thead>
              <tr>
                <th scope="col">From</th>
                <th scope="col">To cluster</th>
                <th scope="col">Path</th>
                <th scope="col">Open</th>
                <th scope="col">Connections</th>
                <th scope="col">Bytes</th>
                <th scope="col">Failures</th>
              </tr>
            </thead>
            <tbody>
              {paths.map((p: any) => (
                <tr key={`${p.from}/${p.peer}/${p.path}`}>
                  <td>{p.from}</td>
                  <td>{p.peer}</td>
                  <td>{p.path}</td>
                  <td>{p.active ?? 0}</td>
                  <td>{p.connections ?? 0}</td>
                  <td>{p.bytes ?? 0}</td>
                  <td>{p.failures ?? 0}</td>
                </tr>
              ))}
            </tbody>
          </table>
        ) : null}
      </Section>
    </main>
  );
}
