// Hash routes (`#/jobs/NAME`): the server serves one document at `/`, and nothing after
// `#` ever reaches it (so a login link's code in `#login=...` stays in the browser).
import { useEffect, useState } from 'preact/hooks';

export function currentRoute(): string[] {
  const hash = window.location.hash.replace(/^#\/?/, '');
  if (hash.startsWith('login=')) return ['login'];
  return hash.split('?')[0].split('/').filter(Boolean).map(decodeURIComponent);
}

/** The route's query (`#/compare?tasks=...`). */
export function currentQuery(): URLSearchParams {
  const hash = window.location.hash;
  const q = hash.indexOf('?');
  return new URLSearchParams(q >= 0 ? hash.slice(q + 1) : '');
}

export function useRoute(): string[] {
  const [route, setRoute] = useState(currentRoute());
  useEffect(() => {
    const update = () => setRoute(currentRoute());
    window.addEventListener('hashchange', update);
    return () => window.removeEventListener('hashchange', update);
  }, []);
  return route;
}

export const href = (...parts: string[]) => '#/' + parts.map(encodeURIComponent).join('/');

export function navigate(...parts: string[]) {
  window.location.hash = href(...parts).slice(1);
}
