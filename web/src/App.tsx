import { useEffect, useState } from 'preact/hooks';
import { currentSession, logout, onUnauthorized, Session } from './api';
import { parseRuns } from './chart';
import { Admin } from './pages/Admin';
import { Compare } from './pages/Compare';
import { Create } from './pages/Create';
import { Devices } from './pages/Devices';
import { DomainDetail, Domains } from './pages/Domains';
import { JobDetail, Jobs } from './pages/Jobs';
import { Login } from './pages/Login';
import { Nodes } from './pages/Nodes';
import { Overview } from './pages/Overview';
import { SshKeys } from './pages/SshKeys';
import { TaskDetail } from './pages/TaskDetail';
import { Tasks } from './pages/Tasks';
import { WorkflowDetail, Workflows } from './pages/Workflows';
import { currentQuery, href, useRoute } from './router';

export function App() {
  const [session, setSession] = useState<Session | null | undefined>(undefined);
  const route = useRoute();

  useEffect(() => {
    // Any request that finds the session gone (expired, logged out elsewhere, token
    // revoked) brings the login page back.
    const unsubscribe = onUnauthorized(() => setSession(null));
    // A login link is exchanged by the login page; anything else asks who we are.
    if (route[0] === 'login') setSession(null);
    else
      currentSession()
        .then(setSession)
        .catch(() => setSession(null));
    return unsubscribe;
  }, []);

  if (session === undefined) return <p class="muted">Loading…</p>;
  if (session === null) return <Login onLogin={setSession} />;

  const [page, a, b] = route;
  let content;
  switch (page) {
    case undefined:
    case 'login':
      content = <Overview />;
      break;
    case 'clusters':
      content = <Nodes session={session} cluster={a} />;
      break;
    case 'jobs':
      content = a ? <JobDetail name={a} session={session} /> : <Jobs />;
      break;
    case 'workflows':
      content = a ? <WorkflowDetail name={a} session={session} /> : <Workflows />;
      break;
    case 'tasks':
      content = a && b ? <TaskDetail namespace={a} name={b} session={session} /> : <Tasks />;
      break;
    case 'compare':
      content = <Compare runs={parseRuns(currentQuery().get('tasks'))} />;
      break;
    case 'domains':
      content = a ? <DomainDetail name={a} /> : <Domains />;
      break;
    case 'devices':
      content = <Devices session={session} />;
      break;
    case 'sshkeys':
      content = <SshKeys session={session} />;
      break;
    case 'admin':
      content = session.role === 'admin' ? <Admin /> : <p>Administration needs the admin role; you are a {session.role}.</p>;
      break;
    case 'create':
      content = session.canWrite ? <Create /> : <p>Creating needs the admin role; you are a {session.role}.</p>;
      break;
    default:
      content = <p>No page {page}.</p>;
  }
  const current = (p: string | undefined) => ((page ?? '') === (p ?? '') ? 'page' : undefined);
  return (
    <>
      <header>
        {/* The routes live in the hash, so the link moves focus itself instead of
            changing the hash to #content (which would name a page). */}
        <a
          class="skip"
          href="#content"
          onClick={(e) => {
            e.preventDefault();
            const content = document.getElementById('content');
            content?.focus();
            content?.scrollIntoView();
          }}
        >
          Skip to content
        </a>
        <nav aria-label="Main">
          <a href={href()} aria-current={current(undefined)}>
            Overview
          </a>
          <a href={href('clusters')} aria-current={current('clusters')}>
            Clusters
          </a>
          <a href={href('jobs')} aria-current={current('jobs')}>
            Jobs
          </a>
          <a href={href('workflows')} aria-current={current('workflows')}>
            Workflows
          </a>
          <a href={href('tasks')} aria-current={current('tasks')}>
            Tasks
          </a>
          <a href={href('domains')} aria-current={current('domains')}>
            Domains
          </a>
          <a href={href('devices')} aria-current={current('devices')}>
            Devices
          </a>
          <a href={href('sshkeys')} aria-current={current('sshkeys')}>
            SSH keys
          </a>
          {session.canWrite ? (
            <a href={href('create')} aria-current={current('create')}>
              Create
            </a>
          ) : null}
          {session.role === 'admin' ? (
            <a href={href('admin')} aria-current={current('admin')}>
              Admin
            </a>
          ) : null}
        </nav>
        <div class="who">
          <span data-testid="user">
            {session.user} ({session.role})
          </span>
          <button
            type="button"
            onClick={async () => {
              try {
                await logout();
              } finally {
                setSession(null);
              }
            }}
          >
            Log out
          </button>
        </div>
      </header>
      <div id="content" tabIndex={-1}>
        {content}
      </div>
    </>
  );
}
