// The console's HTTP client: the Kubernetes API and /rlark/v1 routes of the server that
// served the page, authenticated by the session cookie (HttpOnly: scripts never see it).
// State-changing requests carry the session's CSRF token, which lives only in memory.

export interface Session {
  user: string;
  groups: string[];
  role: 'admin' | 'viewer' | 'other';
  canWrite: boolean;
  csrfToken: string | null;
  expiresAt: string | null;
  /** How a cookie session was created: a bearer token or a one-time link. */
  loginWith?: 'token' | 'link' | null;
}

/** One `Status.details.causes` entry: the field it is about and what is wrong with it. */
export interface Cause {
  field?: string;
  message: string;
  reason?: string;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly reason: string = '',
    readonly causes: Cause[] = [],
  ) {
    super(message);
  }
}

let csrfToken: string | null = null;

export function setCsrfToken(token: string | null) {
  csrfToken = token;
}

/** Listeners told when a request finds the session gone (401). */
const unauthorizedListeners = new Set<() => void>();
export function onUnauthorized(listener: () => void): () => void {
  unauthorizedListeners.add(listener);
  return () => unauthorizedListeners.delete(listener);
}

export async function toApiError(response: Response): Promise<ApiError> {
  const text = await response.text();
  try {
    const status = JSON.parse(text);
    return new ApiError(
      response.status,
      status.message ?? `${response.status} ${response.statusText}`,
      status.reason ?? '',
      status.details?.causes ?? [],
    );
  } catch {
    return new ApiError(response.status, text || `${response.status} ${response.statusText}`);
  }
}

export interface RequestOptions {
  method?: string;
  body?: string;
  contentType?: string;
  signal?: AbortSignal;
}

export async function request(path: string, options: RequestOptions = {}): Promise<Response> {
  const method = options.method ?? 'GET';
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (options.contentType) headers['Content-Type'] = options.contentType;
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) headers['X-Rlark-CSRF'] = csrfToken;
  const response = await fetch(path, {
    method,
    headers,
    body: options.body,
    credentials: 'same-origin',
    signal: options.signal,
  });
  if (!response.ok) {
    const error = await toApiError(response);
    if (response.status === 401) unauthorizedListeners.forEach((l) => l());
    throw error;
  }
  return response;
}

export async function getJson<T = any>(path: string, signal?: AbortSignal): Promise<T> {
  return (await request(path, { signal })).json();
}

export async function sendJson<T = any>(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<T> {
  const response = await request(path, {
    method,
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    contentType: body === undefined ? undefined : contentType,
  });
  const text = await response.text();
  return text ? JSON.parse(text) : (undefined as T);
}

export const mergePatch = (path: string, patch: unknown) =>
  sendJson('PATCH', path, patch, 'application/merge-patch+json');

// ---- session ----

export async function login(credential: { token: string } | { code: string }): Promise<Session> {
  const response = await fetch('/rlark/v1/console/login', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
    body: JSON.stringify(credential),
    credentials: 'same-origin',
  });
  if (!response.ok) throw await toApiError(response);
  const session: Session = await response.json();
  setCsrfToken(session.csrfToken);
  return session;
}

export async function currentSession(): Promise<Session | null> {
  const response = await fetch('/rlark/v1/console/session', { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  if (response.status === 401) return null;
  if (!response.ok) throw await toApiError(response);
  const session: Session = await response.json();
  setCsrfToken(session.csrfToken);
  return session;
}

export async function logout(): Promise<void> {
  await request('/rlark/v1/console/logout', { method: 'POST' });
  setCsrfToken(null);
}

// ---- resource paths ----

export const RLINF = '/apis/rlinf.io/v1alpha1';

export function resourcePath(plural: string, namespace?: string, name?: string, group = RLINF): string {
  let path = group;
  if (namespace) path += `/namespaces/${encodeURIComponent(namespace)}`;
  path += `/${plural}`;
  if (name) path += `/${encodeURIComponent(name)}`;
  return path;
}

/** The collection URL of a manifest's kind, for a create. */
export function createPath(manifest: { apiVersion?: string; kind?: string; metadata?: { namespace?: string } }): string {
  const apiVersion = manifest.apiVersion ?? '';
  const kind = manifest.kind ?? '';
  const plurals: Record<string, [string, boolean]> = {
    Job: ['jobs', false],
    Workflow: ['workflows', false],
    Domain: ['domains', false],
    Task: ['tasks', true],
    DomainPeer: ['domainpeers', true],
    Node: ['nodes', true],
  };
  if (apiVersion !== 'rlinf.io/v1alpha1' || !(kind in plurals)) {
    throw new ApiError(400, `the console creates rlinf.io/v1alpha1 Jobs, Workflows, Domains and Tasks; this manifest is ${apiVersion || '(no apiVersion)'} ${kind || '(no kind)'}`);
  }
  const [plural, namespaced] = plurals[kind];
  return resourcePath(plural, namespaced ? manifest.metadata?.namespace ?? 'default' : undefined);
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    creationTimestamp?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    deletionTimestamp?: string;
  };
  spec?: any;
  status?: any;
}

export const keyOf = (o: KubeObject) => `${o.metadata.namespace ?? ''}/${o.metadata.name}`;
