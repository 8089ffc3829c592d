import { cleanup, fireEvent, render } from '@testing-library/preact';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Line } from '../chart';
import { LineChart } from './LineChart';

const a: Line = { run: 0, label: 'default/a-main', points: [1, 2, 3, 4, 5].map((x) => ({ x, y: x * 1.5 })) };
const b: Line = { run: 1, label: 'default/b-main', points: [1, 2, 3].map((x) => ({ x, y: 0.1 * x })) };

afterEach(cleanup);

// jsdom has no pointer events: without `onpointermove` on elements Preact would listen
// for "PointerMove" (it lowercases only the event names an element knows).
const POINTER = ['onpointermove', 'onpointerdown', 'onpointerleave'];
beforeAll(() => POINTER.forEach((p) => Object.defineProperty(Element.prototype, p, { value: null, writable: true, configurable: true })));
afterAll(() => POINTER.forEach((p) => delete (Element.prototype as any)[p]));

const texts = (root: Element, selector: string) => [...root.querySelectorAll(selector)].map((t) => t.textContent);

describe('LineChart', () => {
  it('draws a line per run with step and value ticks, a title and a legend', () => {
    const { container, getByRole } = render(<LineChart name="reward" lines={[a, b]} />);
    const figure = container.querySelector('figure[data-series="reward"]')!;
    expect(figure.getAttribute('data-runs')).toBe('2');
    expect(figure.getAttribute('data-points')).toBe('8');
    expect(figure.querySelector('figcaption')!.textContent).toBe('reward: 2 runs');
    expect([...figure.querySelectorAll('polyline')].map((p) => [p.getAttribute('data-run'), p.getAttribute('class')])).toEqual([
      ['default/a-main', 'chart-line run-0'],
      ['default/b-main', 'chart-line run-1'],
    ]);
    expect(texts(figure, '[data-axis="x"] .chart-tick')).toEqual(['1', '2', '3', '4', '5']);
    expect(texts(figure, '[data-axis="x"] .chart-axis-label')).toEqual(['step']);
    expect(texts(figure, '[data-axis="y"] .chart-tick')).toEqual(['0', '2', '4', '6', '8']);
    expect(texts(getByRole('list', { name: 'Runs in reward' }), 'li')).toEqual(['default/a-main', 'default/b-main']);
  });

  it('one run: no legend, its last value, minimum and maximum with four significant digits', () => {
    const line: Line = { run: 0, label: 'ns/t', points: [{ x: 0, y: 0.1 + 0.2 }, { x: 10, y: 2 / 3 }] };
    const { container } = render(<LineChart name="metrics.loss" lines={[line]} />);
    expect(container.querySelector('figcaption')!.textContent).toBe('metrics.loss: 2 points, last 0.6667 (min 0.3, max 0.6667)');
    expect(container.querySelector('.chart-legend')).toBeNull();
    expect(texts(container, '[data-axis="y"] .chart-tick')).toEqual(['0.3', '0.4', '0.5', '0.6', '0.7']);
    expect(container.querySelector('[data-testid="readout-metrics.loss"]')!.textContent).toBe('last 0.6667 at step 10');
  });

  it('shows every run at the nearest step by keyboard and by pointer', () => {
    const { container, getByRole } = render(<LineChart name="reward" lines={[a, b]} />);
    const plot = getByRole('img');
    const readout = () => container.querySelector('[data-testid="readout-reward"]')!.textContent;
    const tip = () => texts(container, '.chart-hover text');
    expect(readout()).toBe('default/a-main: last 7.5 at step 5, default/b-main: last 0.3 at step 3');
    fireEvent.focus(plot);
    expect(container.querySelector('.chart-hover')!.getAttribute('data-step')).toBe('5');
    expect(readout()).toBe('step 5: default/a-main: 7.5, default/b-main: 0.3 (at step 3)');
    expect(tip()).toEqual(['step 5', 'default/a-main: 7.5', 'default/b-main: 0.3 (at step 3)']);
    fireEvent.keyDown(plot, { key: 'ArrowLeft' });
    fireEvent.keyDown(plot, { key: 'ArrowLeft' });
    expect(readout()).toBe('step 3: default/a-main: 4.5, default/b-main: 0.3');
    fireEvent.keyDown(plot, { key: 'Home' });
    fireEvent.keyDown(plot, { key: 'ArrowLeft' });
    expect(readout()).toBe('step 1: default/a-main: 1.5, default/b-main: 0.1');
    expect(container.querySelectorAll('.chart-hover circle')).toHaveLength(2);
    fireEvent.blur(plot);
    expect(container.querySelector('.chart-hover')).toBeNull();
    // The pointer: the plot is 640 px wide (its view box's width), steps 1..5 span x 58..624.
    plot.getBoundingClientRect = () => ({ left: 0, top: 0, width: 640, height: 260, right: 640, bottom: 260, x: 0, y: 0, toJSON: () => ({}) });
    // (jsdom has no PointerEvent: a MouseEvent of that type carries clientX.)
    fireEvent(plot, new MouseEvent('pointermove', { bubbles: true, clientX: 58 + (624 - 58) * 0.5 + 10 }));
    expect(readout()).toBe('step 3: default/a-main: 4.5, default/b-main: 0.3');
    fireEvent(plot, new MouseEvent('pointermove', { bubbles: true, clientX: 630 }));
    expect(readout()).toBe('step 5: default/a-main: 7.5, default/b-main: 0.3 (at step 3)');
    fireEvent(plot, new MouseEvent('pointermove', { bubbles: true, clientX: 58 + (624 - 58) * 0.5 + 10 }));
    expect(readout()).toBe('step 3: default/a-main: 4.5, default/b-main: 0.3');
    fireEvent.pointerLeave(plot);
    expect(container.querySelector('.chart-hover')).toBeNull();
  });
});
