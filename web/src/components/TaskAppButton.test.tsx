import { cleanup, fireEvent, render, waitFor } from '@testing-library/preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { TaskAppButton } from './TaskAppButton';

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
  vi.restoreAllMocks();
});

const LINK = 'https://localhost:8444/rlark/v1/proxy-login?ticket=abc';

describe('TaskAppButton', () => {
  it('asks for a one-time ticket and opens it in a new tab cut from the console', async () => {
    const fetch = vi.fn(async () => new Response(JSON.stringify({ url: LINK, expiresInSeconds: 60 }), { status: 200 }));
    vi.stubGlobal('fetch', fetch);
    const tab = { opener: window as unknown, location: { replace: vi.fn() }, close: vi.fn() };
    const open = vi.spyOn(window, 'open').mockReturnValue(tab as unknown as Window);
    const { getByRole } = render(
      <TaskAppButton app={{ namespace: 'rlark-a', task: 'board-main', replica: 1, port: 6006 }}>Open port 6006</TaskAppButton>,
    );
    // A button, not a link to the proxy on the console's origin.
    const button = getByRole('button', { name: 'Open port 6006' });
    expect(document.querySelector('a[href*="/proxy/"]')).toBeNull();
    fireEvent.click(button);
    await waitFor(() => expect(tab.location.replace).toHaveBeenCalledWith(LINK));
    expect(open).toHaveBeenCalledWith('about:blank', '_blank');
    expect(tab.opener).toBeNull();
    const [path, init] = fetch.mock.calls[0] as unknown as [string, RequestInit];
    expect(path).toBe('/rlark/v1/console/proxy-tickets');
    expect(init.method).toBe('POST');
    expect(JSON.parse(init.body as string)).toEqual({ namespace: 'rlark-a', task: 'board-main', replica: 1, port: 6006 });
  });

  it('closes the tab and says why when the server refuses', async () => {
    const refusal = { kind: 'Status', status: 'Failure', message: 'user "vera" may not reach task rlark-a/board-main', reason: 'Forbidden', code: 403 };
    vi.stubGlobal('fetch', vi.fn(async () => new Response(JSON.stringify(refusal), { status: 403 })));
    const tab = { opener: null, location: { replace: vi.fn() }, close: vi.fn() };
    vi.spyOn(window, 'open').mockReturnValue(tab as unknown as Window);
    const { getByRole, findByRole } = render(<TaskAppButton app={{ namespace: 'rlark-a', task: 'board-main', port: 6006 }}>Open</TaskAppButton>);
    fireEvent.click(getByRole('button', { name: 'Open' }));
    expect((await findByRole('alert')).textContent).toContain('may not reach');
    expect(tab.close).toHaveBeenCalled();
    expect(tab.location.replace).not.toHaveBeenCalled();
  });
});
