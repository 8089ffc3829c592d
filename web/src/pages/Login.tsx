import { useEffect, useState } from 'preact/hooks';
import { ApiError, Session, login } from '../api';

/**
 * Exchanges a bearer token, or the code of a one-time link (`/#login=CODE`), for a session.
 * A link's code is spent only when the person clicks "Log in with this link": a client that
 * merely loads the page (a chat app's link preview, a mail scanner) leaves it unused.
 */
export function Login({ onLogin }: { onLogin: (s: Session) => void }) {
  const [token, setToken] = useState('');
  const [code, setCode] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (credential: { token: string } | { code: string }) => {
    if (busy) return;
    setBusy(true);
    setError(null);
    try {
      onLogin(await login(credential));
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };

  useEffect(() => {
    const match = window.location.hash.match(/^#login=([A-Za-z0-9]+)/);
    if (match) {
      // The code leaves the address bar (and history) before anything else happens; it is
      // kept in this page only, and spent when the person clicks.
      history.replaceState(null, '', window.location.pathname + '#/');
      setCode(match[1]);
    }
  }, []);

  return (
    <main class="login">
      <h1>rlark console</h1>
      {code ? (
        <form
          class="link-login"
          onSubmit={(e) => {
            e.preventDefault();
            submit({ code });
          }}
        >
          <p>This page was opened with a one-time login link. It works once.</p>
          <button type="submit" data-testid="login-link" aria-disabled={busy ? 'true' : undefined}>
            Log in with this link
          </button>
        </form>
      ) : null}
      <form
        onSubmit={(e) => {
          e.preventDefault();
          submit({ token: token.trim() });
        }}
      >
        <label for="token">Bearer token</label>
        <input
          id="token"
          type="password"
          autoComplete="off"
          value={token}
          onInput={(e) => setToken((e.target as HTMLInputElement).value)}
          placeholder="rlk-..."
          required
        />
        <button type="submit" aria-disabled={busy ? 'true' : undefined}>
          Log in
        </button>
        <p class="muted">
          Create a token with <code>rlark token create --user NAME</code>, or open the one-time link <code>rlark up</code> prints
          (an admin makes a new one with <code>rlark token login-link</code>).
        </p>
        {error ? (
          <p class="error" role="alert">
            {error}
          </p>
        ) : null}
      </form>
    </main>
  );
}
