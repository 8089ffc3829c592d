// The task HTTP proxy (`/rlark/v1/namespaces/NS/tasks/NAME[/replicas/I]/proxy/PORT/`,
// docs/ssh.md): links from a task's page to a web app one of its replicas serves.
import type { KubeObject, Session } from './api';

/** The proxy path of `port` on replica `index` of a task (replica 0 has the short form). */
export function proxyPath(namespace: string, task: string, index: number, port: number): string {
  const base = `/rlark/v1/namespaces/${encodeURIComponent(namespace)}/tasks/${encodeURIComponent(task)}`;
  return index === 0 ? `${base}/proxy/${port}/` : `${base}/replicas/${index}/proxy/${port}/`;
}

/** Whether the server lets `session` through the proxy to the tasks of `job`: admins, and
 * the users and groups its `spec.access` names (the rule of `task_access.rs`). */
export function mayReach(session: Session, job: KubeObject | undefined): boolean {
  if (session.role === 'admin') return true;
  const access: { user?: string; group?: string }[] = job?.spec?.access ?? [];
  return access.some((a) => (a.user !== undefined && a.user === session.user) || (a.group !== undefined && session.groups.includes(a.group)));
}

/** A valid TCP port from an input's text, or null. */
export function parsePort(text: string): number | null {
  if (!/^\d{1,5}$/.test(text.trim())) return null;
  const port = Number(text.trim());
  return port >= 1 && port <= 65535 ? port : null;
}

