// The page's Content-Security-Policy has `style-src 'self'` without 'unsafe-inline', so a
// `<style>` element made by a script is refused. xterm.js's DOM renderer makes two (its
// cell sizes and its theme colours) when a terminal opens. `withConstructedStyles` runs
// code (the terminal's `open`) with the document's `createElement('style')` answering a
// stand-in element instead: whatever the code writes to its `textContent` becomes a
// constructed style sheet adopted by the document (CSSOM, which a policy does not govern),
// and removing the element removes the sheet.

/** A stand-in for a `<style>` element whose text lives in an adopted constructed sheet. */
function styleStandIn(doc: Document, create: (tag: string) => HTMLElement): HTMLElement {
  const sheet = new CSSStyleSheet();
  doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
  const element = create('span');
  element.hidden = true;
  element.dataset.constructedStyle = '';
  let text = '';
  Object.defineProperty(element, 'textContent', {
    configurable: true,
    get: () => text,
    set: (value: string | null) => {
      text = value ?? '';
      sheet.replaceSync(text);
    },
  });
  const remove = element.remove.bind(element);
  element.remove = () => {
    doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
    remove();
  };
  return element;
}

/** Runs `run` with `doc.createElement('style')` making stand-ins (above); other elements
 * are made as usual, and `createElement` is restored afterwards, also when `run` throws. */
export function withConstructedStyles<T>(doc: Document, run: () => T): T {
  const original = doc.createElement;
  const create = (tag: string) => original.call(doc, tag) as HTMLElement;
  doc.createElement = function (this: Document, tag: string, options?: ElementCreationOptions) {
    if (String(tag).toLowerCase() === 'style') return styleStandIn(doc, create);
    return original.call(doc, tag, options);
  } as typeof doc.createElement;
  try {
    return run();
  } finally {
    doc.createElement = original;
  }
}
