import { RLINF } from '../api';
import { age, ErrorBanner, Phase } from '../components/common';
import { VirtualList } from '../components/VirtualList';
import { href } from '../router';
import { useWatch } from '../watch';
import { useFilters } from './Jobs';

/** Every Task in every namespace, live; a windowed list, so 10,000 Tasks stay smooth. */
export function Tasks() {
  const tasks = useWatch(`${RLINF}/tasks`);
  const { apply, controls } = useFilters();
  const items = apply(tasks.items);
  return (
    <main>
      <h1>Tasks</h1>
      <ErrorBanner error={tasks.error} />
      {controls('tasks')}
      <p class="muted" aria-live="polite">
        {tasks.loaded ? `${items.length} of ${tasks.items.length} tasks` : 'Loading…'}
      </p>
      <VirtualList
        label="All tasks"
        items={items}
        rowHeight={36}
        height={600}
        header={
          <div class="vlist-row vlist-head" role="row">
            <span role="columnheader">Task</span>
            <span role="columnheader">Phase</span>
            <span role="columnheader">Replicas (ready of desired)</span>
            <span role="columnheader">Cluster</span>
            <span role="columnheader">Age</span>
          </div>
        }
        render={(t) => (
          <>
            <span role="cell">
              <a href={href('tasks', t.metadata.namespace ?? 'default', t.metadata.name)}>{t.metadata.name}</a>
            </span>
            <span role="cell">
              <Phase phase={t.status?.phase} />
            </span>
            <span role="cell">
              {t.status?.readyReplicas ?? 0} of {t.status?.replicas ?? '?'}
            </span>
            <span role="cell">{t.spec?.placement?.clusterID ?? ''}</span>
            <span role="cell">{age(t)}</span>
          </>
        )}
      />
    </main>
  );
}
