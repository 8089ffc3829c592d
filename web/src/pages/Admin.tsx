import { useState } from 'preact/hooks';
import { ApiError, getJson, sendJson } from '../api';
import { ListName, useChanges } from '../changes';
import { ErrorBanner, Section } from '../components/common';

const ADMIN_LISTS: ListName[] = ['tokens', 'jointokens', 'certificates', 'revocations'];

/** `rlark join ...` for a bootstrap token, as `rlark token create` prints it. */
export function joinCommand(server: string, token: string, caHash: string, clusterId?: string): string {
  const word = (w: string) => (/^[A-Za-z0-9_./:=@%+-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`);
  let command = `rlark join --server ${word(server)} --token ${word(token)} --ca-hash ${word(caHash)}`;
  if (clusterId) command += ` --cluster-id ${word(clusterId)}`;
  return command;
}

function Copyable({ text, label }: { text: string; label: string }) {
  const [copied, setCopied] = useState(false);
  return (
    <div class="copyable">
      <code data-testid={label}>{text}</code>{' '}
      <button
        type="button"
        aria-label={`Copy ${label}`}
        onClick={async () => {
          await navigator.clipboard.writeText(text);
          setCopied(true);
        }}
      >
        {copied ? 'Copied' : 'Copy'}
      </button>
    </div>
  );
}

const errorText = (e: unknown) => (e instanceof ApiError ? e.message : String(e));

/** Admins: join tokens, user tokens, certificates and revocations (`/rlark/v1/...`). */
export function Admin() {
  const [certificates, setCertificates] = useState<any[]>([]);
  const [revocations, setRevocations] = useState<any[]>([]);
  const [tokens, setTokens] = useState<any[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [join, setJoin] = useState<string | null>(null);
  const [clusterId, setClusterId] = useState('');
  const [ttl, setTtl] = useState('3600');
  const [user, setUser] = useState('');
  const [role, setRole] = useState('viewer');
  const [userToken, setUserToken] = useState<{ token: string; id: string } | null>(null);
  const [tokenId, setTokenId] = useState('');
  const [notice, setNotice] = useState<string | null>(null);

  const [joinTokens, setJoinTokens] = useState<any[]>([]);
  const [live, setLive] = useState<string | null>(null);

  // Not Kubernetes resources: the server pushes which lists changed (changes.ts), made
  // here, with the CLI or on another replica, and the page reads those again.
  useChanges(
    ADMIN_LISTS,
    (lists) => {
      const read = async (path: string, set: (items: any[]) => void) => {
        try {
          set((await getJson(path)).items ?? []);
        } catch (e) {
          setError(errorText(e));
        }
      };
      if (lists.has('certificates')) read('/rlark/v1/certificates', setCertificates);
      if (lists.has('revocations')) read('/rlark/v1/revocations', setRevocations);
      if (lists.has('tokens')) read('/rlark/v1/tokens', setTokens);
      if (lists.has('jointokens')) read('/rlark/v1/tokens?kind=bootstrap', setJoinTokens);
    },
    setLive,
  );

  const act = async (what: () => Promise<void>) => {
    setError(null);
    setNotice(null);
    try {
      await what();
    } catch (e) {
      setError(errorText(e));
    }
  };

  return (
    <main>
      <h1>Administration</h1>
      <ErrorBanner error={error} />
      {live ? (
        <p class="muted" data-testid="live-status">
          {live}
        </p>
      ) : null}
      {notice ? <p role="status">{notice}</p> : null}
      <Section title="Join a cluster">
        <form
          class="inline-form"
          onSubmit={(e) => {
            e.preventDefault();
            act(async () => {
              const seconds = Number(ttl);
              if (!Number.isInteger(seconds) || seconds <= 0) throw new Error('the lifetime must be a whole number of seconds');
              // A join token is bound to the one cluster that joins with it.
              if (!clusterId.trim()) throw new Error('a join token needs the cluster ID of the cluster that joins with it');
              const r = await sendJson('POST', '/rlark/v1/tokens', { kind: 'bootstrap', ttlSeconds: seconds, clusterID: clusterId.trim() });
              setJoin(joinCommand(window.location.origin, r.token, r.caHash, clusterId.trim()));
            });
          }}
        >
          <label>
            Cluster ID{' '}
            <input value={clusterId} required onInput={(e) => setClusterId((e.target as HTMLInputElement).value)} placeholder="edge-1" />
          </label>
          <label>
            Valid for (seconds) <input value={ttl} inputMode="numeric" onInput={(e) => setTtl((e.target as HTMLInputElement).value)} />
          </label>
          <button type="submit">Create join token</button>
        </form>
        {join ? <Copyable text={join} label="join command" /> : null}
        {joinTokens.length ? (
          <table aria-label="Join tokens">
            <thead>
              <tr>
                <th scope="col">ID</th>
                <th scope="col">Cluster</th>
                <th scope="col">Expires</th>
                <th scope="col">Used by</th>
                <th scope="col">Created by</th>
              </tr>
            </thead>
            <tbody>
              {joinTokens.map((t) => (
                <tr key={t.id} data-join-token={t.id}>
                  <td class="small">{t.id}</td>
                  <td>{t.clusterID ?? 'any'}</td>
                  <td>{t.expiresAt}</td>
                  <td>{(t.usedBy ?? []).join(', ')}</td>
                  <td>{t.createdBy}</td>
                </tr>
              ))}
            </tbody>
          </table>
        ) : (
          <p class="muted">No join tokens.</p>
        )}
      </Section>
      <Section title="User tokens">
        <form
          class="inline-form"
          onSubmit={(e) => {
            e.preventDefault();
            act(async () => {
              const r = await sendJson('POST', '/rlark/v1/tokens', { kind: 'user', user, role });
              setUserToken({ token: r.token, id: r.id });
            });
          }}
        >
          <label>
            User <input value={user} required onInput={(e) => setUser((e.target as HTMLInputElement).value)} />
          </label>
          <label>
            Role{' '}
            <select value={role} onChange={(e) => setRole((e.target as HTMLSelectElement).value)}>
              <option>viewer</option>
              <option>admin</option>
            </select>
          </label>
          <button type="submit">Create user token</button>
        </form>
        {userToken ? (
          <>
            <p>Token {userToken.id} (shown once; it logs in here and works as a bearer token):</p>
            <Copyable text={userToken.token} label="user token" />
          </>
        ) : null}
        <form
          class="inline-form"
          onSubmit={(e) => {
            e.preventDefault();
            act(async () => {
              await sendJson('POST', '/rlark/v1/revocations', { tokenID: tokenId.trim(), reason: 'revoked in the web console' });
              setNotice(`Token ${tokenId.trim()} revoked.`);
              setTokenId('');
            });
          }}
        >
          <label>
            Token ID <input value={tokenId} required placeholder="rlk-..." onInput={(e) => setTokenId((e.target as HTMLInputElement).value)} />
          </label>
          <button type="submit">Revoke token</button>
        </form>
      </Section>
      <Section title="Bearer tokens">
        <table aria-label="Bearer tokens">
          <thead>
            <tr>
              <th scope="col">ID</th>
              <th scope="col">User</th>
              <th scope="col">Groups</th>
              <th scope="col">Task</th>
              <th scope="col">Expires</th>
              <th scope="col">Created by</th>
              <th scope="col">Revoked</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {tokens.map((t) => (
              <tr key={t.id} data-token={t.id}>
                <td class="small">{t.id}</td>
                <td>{t.user}</td>
                <td>{(t.groups ?? []).join(', ')}</td>
                <td>{t.task ? `${t.task.namespace}/${t.task.name}` : ''}</td>
                <td>{t.expiresAt ?? 'never'}</td>
                <td>{t.createdBy}</td>
                <td data-testid="token-revoked">{t.revokedAt ?? ''}</td>
                <td>
                  {t.revokedAt ? null : (
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Revoke token ${t.id} of ${t.user}`}
                      onClick={() =>
                        window.confirm(`Revoke token ${t.id} of ${t.user}?`) &&
                        act(async () => {
                          await sendJson('POST', '/rlark/v1/revocations', { tokenID: t.id, reason: 'revoked in the web console' });
                          setNotice(`Token ${t.id} revoked.`);
                        })
                      }
                    >
                      Revoke
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
      <Section title="Certificates">
        <table aria-label="Certificates">
          <thead>
            <tr>
              <th scope="col">Serial</th>
              <th scope="col">User</th>
              <th scope="col">Role</th>
              <th scope="col">Cluster</th>
              <th scope="col">Valid until</th>
              <th scope="col">Revoked</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {certificates.map((c) => (
              <tr key={c.serial}>
                <td class="small">{c.serial}</td>
                <td>{c.user}</td>
                <td>{c.role}</td>
                <td>{c.clusterID ?? c.clusterId ?? ''}</td>
                <td>{c.notAfter}</td>
                <td>{c.revokedAt ?? ''}</td>
                <td>
                  {c.revokedAt ? null : (
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Revoke certificate ${c.serial} of ${c.user}`}
                      onClick={() =>
                        window.confirm(`Revoke certificate ${c.serial} of ${c.user}?`) &&
                        act(async () => {
                          await sendJson('POST', '/rlark/v1/revocations', { serial: c.serial, reason: 'revoked in the web console' });
                        })
                      }
                    >
                      Revoke
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
      <Section title="Revocations">
        {revocations.length === 0 ? <p class="muted">Nothing revoked.</p> : null}
        {revocations.length ? (
          <table aria-label="Revocations">
            <thead>
              <tr>
                <th scope="col">Serial</th>
                <th scope="col">User</th>
                <th scope="col">Reason</th>
                <th scope="col">By</th>
                <th scope="col">At</th>
              </tr>
            </thead>
            <tbody>
              {revocations.map((r) => (
                <tr key={r.serial}>
                  <td class="small">{r.serial}</td>
                  <td>{r.user}</td>
                  <td>{r.reason}</td>
                  <td>{r.revokedBy}</td>
                  <td>{r.revokedAt}</td>
                </tr>
              ))}
            </tbody>
          </table>
        ) : null}
      </Section>
    </main>
  );
}
