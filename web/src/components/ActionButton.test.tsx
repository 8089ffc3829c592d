import { cleanup, fireEvent, render } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ActionButton } from './common';

afterEach(cleanup);

describe('ActionButton', () => {
  it('ignores presses while busy but keeps the focus (no disabled attribute)', () => {
    const onClick = vi.fn();
    const { getByRole, rerender } = render(
      <ActionButton busy={false} onClick={onClick} aria-label="Cordon node n1">
        Cordon
      </ActionButton>,
    );
    const button = getByRole('button', { name: 'Cordon node n1' }) as HTMLButtonElement;
    button.focus();
    fireEvent.click(button);
    expect(onClick).toHaveBeenCalledTimes(1);
    rerender(
      <ActionButton busy={true} onClick={onClick} aria-label="Cordon node n1">
        Cordon
      </ActionButton>,
    );
    expect(button.disabled).toBe(false);
    expect(button.getAttribute('aria-disabled')).toBe('true');
    expect(document.activeElement).toBe(button);
    fireEvent.click(button);
    expect(onClick).toHaveBeenCalledTimes(1);
  });
});
