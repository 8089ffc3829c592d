import { cleanup, fireEvent, render } from '@testing-library/preact';
import { afterEach, describe, expect, it } from 'vitest';

afterEach(cleanup);
import { VirtualList } from './VirtualList';

describe('VirtualList', () => {
  const items = Array.from({ length: 10_000 }, (_, i) => `task-${i}`);

  it('renders only the rows in view for 10,000 items', () => {
    const { container } = render(<VirtualList label="Tasks" items={items} rowHeight={20} height={200} render={(t) => <span>{t}</span>} />);
    const rows = container.querySelectorAll('.vlist-row');
    expect(rows.length).toBeLessThanOrEqual(200 / 20 + 10 + 1);
    expect(rows[0].textContent).toBe('task-0');
    expect(container.querySelector('[role=table]')!.getAttribute('aria-rowcount')).toBe('10000');
  });

  it('follows the scroll position', () => {
    const { container } = render(<VirtualList label="Tasks" items={items} rowHeight={20} height={200} render={(t) => <span>{t}</span>} />);
    const viewport = container.querySelector('.vlist-viewport') as HTMLDivElement;
    viewport.scrollTop = 20 * 5000;
    fireEvent.scroll(viewport);
    const texts = [...container.querySelectorAll('.vlist-row')].map((r) => r.textContent);
    expect(texts).toContain('task-5000');
    expect(texts).not.toContain('task-0');
  });
});
