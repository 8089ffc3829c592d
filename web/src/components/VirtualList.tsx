// A windowed list: only the rows in view (plus a margin) are in the DOM, so 10,000 Tasks
// scroll as smoothly as 10. Rows have a fixed height. Positioning is in style.css; the
// computed sizes and offsets are written through the CSSOM (`element.style`, which is what
// Preact does with a `style` object), never as a `style` attribute, which the page's
// Content-Security-Policy (no 'unsafe-inline') would refuse.
import { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';

export interface VirtualListProps<T> {
  items: T[];
  rowHeight: number;
  height: number;
  header?: ComponentChildren;
  render: (item: T, index: number) => ComponentChildren;
  label: string;
  overscan?: number;
  /** Extra class of every row (the header's own class is the caller's), e.g. a column layout. */
  rowClass?: string;
}

export function VirtualList<T>({ items, rowHeight, height, header, render, label, overscan = 10, rowClass }: VirtualListProps<T>) {
  const [scrollTop, setScrollTop] = useState(0);
  const first = Math.max(0, Math.floor(scrollTop / rowHeight) - overscan);
  const last = Math.min(items.length, Math.ceil((scrollTop + height) / rowHeight) + overscan);
  const visible = items.slice(first, last);
  return (
    <div class="vlist" role="table" aria-label={label} aria-rowcount={items.length}>
      {header}
      <div
        class="vlist-viewport"
        style={{ height: `${Math.min(height, Math.max(rowHeight, items.length * rowHeight))}px` }}
        onScroll={(e) => setScrollTop((e.currentTarget as HTMLDivElement).scrollTop)}
        tabIndex={0}
        role="rowgroup"
      >
        <div class="vlist-canvas" style={{ height: `${items.length * rowHeight}px` }}>
          {visible.map((item, i) => (
            <div
              class={rowClass ? `vlist-row ${rowClass}` : 'vlist-row'}
              role="row"
              aria-rowindex={first + i + 1}
              key={first + i}
              style={{ top: `${(first + i) * rowHeight}px`, height: `${rowHeight}px` }}
            >
              {render(item, first + i)}
            </div>
          ))}
        </div>
      </div>
    </div>
  );
}
