import { useState } from 'preact/hooks';
import { RLINF } from '../api';
import { compareHref, parseRuns } from '../chart';
import { age, ErrorBanner, Phase } from '../components/common';
import { VirtualList } from '../components/VirtualList';
import { href } from '../router';
import { useWatch } from '../watch';
import { useFilters } from './Jobs';

/** Every Task in every namespace, live; a windowed list, so 10,000 Tasks stay smooth. Tick
 * two or more to compare their rewards and metrics (the compare page). */
export function Tasks() {
  const tasks = useWatch(`${RLINF}/tasks`);
  const { apply, controls } = useFilters();
  const items = apply(tasks.items);
  // `namespace/name` of the ticked tasks, in the order ticked.
  const [picked, setPicked] = useState<string[]>([]);
  const toggle = (key: string, on: boolean) => setPicked((p) => (on ? [...p.filter((k) => k !== key), key] : p.filter((k) => k !== key)));
  return (
    <main>
      <h1>Tasks</h1>
      <ErrorBanner error={tasks.error} />
      {controls('tasks')}
      <div class="actions">
        <button type="button" disabled={picked.length < 2} onClick={() => (window.location.hash = compareHref(parseRuns(picked.join(','))).slice(1))}>
          Compare rewards
        </button>
        <span class="muted" aria-live="polite">
          {picked.length === 0 ? 'Tick two or more tasks to compare their rewards and metrics.' : `${picked.length} ticked: ${picked.join(', ')}`}
        </span>
        {picked.length > 0 ? (
          <button type="button" class="link" onClick={() => setPicked([])}>
            Clear
          </button>
        ) : null}
      </div>
      <p class="muted" aria-live="polite">
        {tasks.loaded ? `${items.length} of ${tasks.items.length} tasks` : 'Loading…'}
      </p>
      <VirtualList
        label="All tasks"
        items={items}
        rowHeight={36}
        height={600}
        rowClass="with-reward"
        header={
          <div class="vlist-row vlist-head with-reward" role="row">
            <span role="columnheader">Task</span>
            <span role="columnheader">Phase</span>
            <span role="columnheader">Replicas (ready of desired)</span>
            <span role="columnheader">Cluster</span>
            <span role="columnheader" title="The newest and the mean reward the task reported">Reward (last/mean)</span>
            <span role="columnheader">Age</span>
          </div>
        }
        render={(t) => {
          const key = `${t.metadata.namespace ?? 'default'}/${t.metadata.name}`;
          return (
          <>
            <span role="cell">
              <input type="checkbox" class="pick" checked={picked.includes(key)} onChange={(e) => toggle(key, (e.target as HTMLInputElement).checked)} aria-label={`Compare ${key}`} />
              <a href={href('tasks', t.metadata.namespace ?? 'default', t.metadata.name)}>{t.metadata.name}</a>
            </span>
            <span role="cell">
              <Phase phase={t.status?.phase} />
            </span>
            <span role="cell">
              {t.status?.readyReplicas ?? 0} of {t.status?.replicas ?? '?'}
            </span>
            <span role="cell">{t.spec?.placement?.clusterID ?? ''}</span>
            <span role="cell" data-reward>{t.status?.reward?.summary ?? ''}</span>
            <span role="cell">{age(t)}</span>
          </>
          );
        }}
      />
    </main>
  );
}
