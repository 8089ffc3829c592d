// The SSH keys a user registers to `ssh` into tasks (`/rlark/v1/sshkeys`, docs/ssh.md), and
// the SSH endpoint's address and host key (`/rlark/v1/sshinfo`). Every user manages their
// own keys; admins see and remove everyone's.
import { useEffect, useState } from 'preact/hooks';
import { ApiError, getJson, sendJson, Session } from '../api';
import { ListName, useChanges } from '../changes';
import { ActionButton, ErrorBanner, Section } from '../components/common';

const SSH_LISTS: ListName[] = ['sshkeys'];

export interface SshKey {
  id: string;
  user: string;
  groups: string[];
  publicKey: string;
  fingerprint: string;
  comment: string;
  createdAt: string;
  registeredWith: { kind: 'certificate'; serial: string } | { kind: 'token'; id: string };
}

export interface SshInfo {
  enabled: boolean;
  port?: number;
  hostKey?: string;
  hostKeyFingerprint?: string;
  caPublicKey: string;
}

/** `ssh` to a task through the endpoint, as the page shows it. */
export function sshCommand(host: string, port: number | undefined, login = 'TASK'): string {
  return port && port !== 22 ? `ssh -p ${port} ${login}@${host}` : `ssh ${login}@${host}`;
}

export function registeredWith(k: SshKey): string {
  return k.registeredWith.kind === 'token' ? `token ${k.registeredWith.id}` : `certificate ${k.registeredWith.serial}`;
}

const errorText = (e: unknown) => (e instanceof ApiError ? e.message : String(e));

export function SshKeys({ session }: { session: Session }) {
  const [keys, setKeys] = useState<SshKey[]>([]);
  const [info, setInfo] = useState<SshInfo | null>(null);
  const [loaded, setLoaded] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const [publicKey, setPublicKey] = useState('');
  const [busy, setBusy] = useState(false);
  const admin = session.role === 'admin';
  useEffect(() => {
    getJson('/rlark/v1/sshinfo')
      .then(setInfo)
      .catch((e) => setError(errorText(e)));
  }, []);
  // Keys are not Kubernetes resources: the server pushes when they change (changes.ts;
  // a non-admin hears of their own keys only) and the page reads them again.
  useChanges(SSH_LISTS, () =>
    getJson('/rlark/v1/sshkeys')
      .then((k) => {
        setKeys(k.items ?? []);
        setLoaded(true);
      })
      .catch((e) => setError(errorText(e))),
  );
  const act = async (what: () => Promise<void>) => {
    setBusy(true);
    setError(null);
    setNotice(null);
    try {
      await what();
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };
  // A key stays valid while the credential it was registered with does; a session from a
  // one-time login link has none, so the server refuses (400): say so before.
  const canRegister = session.loginWith !== 'link';
  return (
    <main>
      <h1>SSH keys</h1>
      <ErrorBanner error={error} />
      {notice ? <p role="status">{notice}</p> : null}
      <Section title="The SSH endpoint">
        {info === null ? null : info.enabled ? (
          <dl class="facts">
            <dt>Log in to a task</dt>
            <dd>
              <code data-testid="ssh-command">{sshCommand(window.location.hostname, info.port)}</code> (replica N: <code>TASK.N</code>; a list of yours:{' '}
              <code>menu</code>)
            </dd>
            <dt>Host key</dt>
            <dd>
              <code data-testid="ssh-host-key">{info.hostKeyFingerprint}</code>
            </dd>
          </dl>
        ) : (
          <p data-testid="ssh-disabled">This server has no SSH endpoint (it is on with <code>rlark server --ssh-listen ADDR</code>). Keys registered here are kept for when it is.</p>
        )}
      </Section>
      <Section title="Register a key">
        {canRegister ? null : (
          <p id="ssh-key-link-login" class="muted" data-testid="ssh-key-needs-token">
            You logged in with a one-time link. A key lives as long as the credential it is registered with, and a link is not one: log in with a bearer token (
            <code>rlark token create --user {session.user}</code>) to register keys here, or run <code>rlark ssh-key add</code>.
          </p>
        )}
        <form
          class="stack-form"
          onSubmit={(e) => {
            e.preventDefault();
            if (busy) return;
            act(async () => {
              const added: SshKey = await sendJson('POST', '/rlark/v1/sshkeys', { publicKey: publicKey.trim() });
              setNotice(`Key ${added.fingerprint} registered.`);
              setPublicKey('');
            });
          }}
        >
          <label for="ssh-public-key">Public key (one OpenSSH line, e.g. the contents of ~/.ssh/id_ed25519.pub)</label>
          <textarea
            id="ssh-public-key"
            rows={3}
            spellcheck={false}
            required
            disabled={!canRegister}
            aria-describedby={canRegister ? undefined : 'ssh-key-link-login'}
            value={publicKey}
            onInput={(e) => setPublicKey((e.target as HTMLTextAreaElement).value)}
          />
          <div>
            <button type="submit" disabled={!canRegister} aria-disabled={busy ? 'true' : undefined}>
              Register key
            </button>
          </div>
        </form>
      </Section>
      <Section title={admin ? "Everyone's keys" : 'Your keys'}>
        {loaded && keys.length === 0 ? <p class="muted">No keys registered.</p> : null}
        {keys.length ? (
          <table aria-label="SSH keys">
            <thead>
              <tr>
                <th scope="col">ID</th>
                <th scope="col">User</th>
                <th scope="col">Fingerprint</th>
                <th scope="col">Comment</th>
                <th scope="col">Registered</th>
                <th scope="col">With</th>
                <th scope="col">Actions</th>
              </tr>
            </thead>
            <tbody>
              {keys.map((k) => (
                <tr key={k.id} data-ssh-key={k.id}>
                  <td class="small">{k.id}</td>
                  <td>{k.user}</td>
                  <td class="small">{k.fingerprint}</td>
                  <td>{k.comment}</td>
                  <td>{k.createdAt}</td>
                  <td class="small">{registeredWith(k)}</td>
                  <td>
                    {admin || k.user === session.user ? (
                      <ActionButton
                        busy={busy}
                        class="danger"
                        aria-label={`Remove SSH key ${k.id} of ${k.user}`}
                        onClick={() =>
                          window.confirm(`Remove SSH key ${k.fingerprint} of ${k.user}? Its open SSH connections close.`) &&
                          act(async () => {
                            await sendJson('DELETE', `/rlark/v1/sshkeys/${encodeURIComponent(k.id)}`);
                            setNotice(`Key ${k.fingerprint} removed.`);
                          })
                        }
                      >
                        Remove
                      </ActionButton>
                    ) : null}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        ) : null}
      </Section>
    </main>
  );
}
