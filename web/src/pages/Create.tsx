import { useRef, useState } from 'preact/hooks';
import { ApiError, createPath, sendJson } from '../api';
import { lineOfField, parseManifest } from '../fieldpath';
import { ActionButton } from '../components/common';
import { navigate } from '../router';

const EXAMPLE = `apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: hello
spec:
  tasks:
    - name: main
      agentType: Raw
      role: Actor
      raw:
        entrypoint: ["python3", "-c", "print('hello from rlark')"]
        replicas: 1
`;

interface FieldError {
  line: number | null;
  field?: string;
  message: string;
}

/** Create a Job (or Workflow, Domain, Task) from YAML; the API's validation errors are shown at their lines. */
export function Create() {
  const [source, setSource] = useState(EXAMPLE);
  const [errors, setErrors] = useState<FieldError[]>([]);
  const [summary, setSummary] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const area = useRef<HTMLTextAreaElement>(null);
  const gutter = useRef<HTMLDivElement>(null);
  const lineCount = source.split('\n').length;
  const errorLines = new Set(errors.map((e) => e.line).filter((l): l is number => l !== null));

  const goTo = (line: number) => {
    const el = area.current;
    if (!el) return;
    const starts = source.split('\n').slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    const end = starts + (source.split('\n')[line - 1]?.length ?? 0);
    el.focus();
    el.setSelectionRange(starts, end);
  };

  const submit = async () => {
    setErrors([]);
    setSummary(null);
    const parsed = parseManifest(source);
    if (!parsed.value) {
      setSummary('The YAML does not parse.');
      setErrors(parsed.errors.map((e) => ({ line: e.line, message: e.message })));
      return;
    }
    setBusy(true);
    try {
      const created = await sendJson('POST', createPath(parsed.value) + '?fieldValidation=Strict', parsed.value);
      const kind = created.kind ?? parsed.value.kind;
      const name = created.metadata?.name;
      if (kind === 'Job') navigate('jobs', name);
      else if (kind === 'Workflow') navigate('workflows', name);
      else if (kind === 'Task') navigate('tasks', created.metadata?.namespace ?? 'default', name);
      else setSummary(`${kind} ${name} created.`);
    } catch (e) {
      if (e instanceof ApiError) {
        setSummary(e.message);
        setErrors(e.causes.map((c) => ({ line: c.field ? lineOfField(source, c.field) : null, field: c.field, message: c.message })));
      } else {
        setSummary(String(e));
      }
    } finally {
      setBusy(false);
    }
  };

  return (
    <main>
      <h1>Create from YAML</h1>
      <p class="muted">A Job, Workflow, Domain or Task manifest (rlinf.io/v1alpha1). Unknown fields are errors.</p>
      <div class="editor">
        <div class="gutter" ref={gutter} aria-hidden="true">
          {Array.from({ length: lineCount }, (_, i) => (
            <div key={i} class={errorLines.has(i + 1) ? 'gutter-error' : ''} data-line={i + 1}>
              {i + 1}
            </div>
          ))}
        </div>
        <label for="manifest" class="visually-hidden">
          Manifest (YAML)
        </label>
        <textarea
          id="manifest"
          ref={area}
          spellcheck={false}
          value={source}
          rows={Math.max(16, lineCount + 1)}
          aria-invalid={errors.length > 0}
          aria-describedby="manifest-errors"
          onInput={(e) => setSource((e.target as HTMLTextAreaElement).value)}
          onScroll={(e) => gutter.current && (gutter.current.scrollTop = (e.target as HTMLTextAreaElement).scrollTop)}
        />
      </div>
      <div class="actions">
        <ActionButton busy={busy} onClick={submit}>
          Create
        </ActionButton>
      </div>
      <div id="manifest-errors" role="alert">
        {summary ? <p class="error">{summary}</p> : null}
        {errors.length ? (
          <ul class="field-errors">
            {errors.map((e, i) => (
              <li key={i} data-line={e.line ?? ''} data-field={e.field ?? ''}>
                {e.line !== null ? (
                  <button type="button" class="link" onClick={() => goTo(e.line!)}>
                    line {e.line}
                  </button>
                ) : null}{' '}
                {e.field ? <code>{e.field}</code> : null} {e.message}
              </li>
            ))}
          </ul>
        ) : null}
      </div>
    </main>
  );
}
