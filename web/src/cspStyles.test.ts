import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { withConstructedStyles } from './cspStyles';

// jsdom has no constructed style sheets: a minimal stand-in records what is written.
class FakeSheet {
  text = '';
  replaceSync(text: string) {
    this.text = text;
  }
}

describe('withConstructedStyles', () => {
  let adopted: FakeSheet[];
  beforeEach(() => {
    adopted = [];
    vi.stubGlobal('CSSStyleSheet', FakeSheet);
    Object.defineProperty(document, 'adoptedStyleSheets', {
      configurable: true,
      get: () => adopted,
      set: (v: FakeSheet[]) => (adopted = v),
    });
  });
  afterEach(() => {
    vi.unstubAllGlobals();
    delete (document as any).adoptedStyleSheets;
    document.body.innerHTML = '';
  });

  it('turns the text of created <style> elements into adopted sheets, and no <style> is in the DOM', () => {
    const host = document.createElement('div');
    document.body.append(host);
    const el = withConstructedStyles(document, () => {
      const style = document.createElement('style');
      host.appendChild(style);
      style.textContent = '.xterm-rows { color: #fff; }';
      return style;
    });
    expect(document.querySelectorAll('style')).toHaveLength(0);
    expect(adopted.map((s) => s.text)).toEqual(['.xterm-rows { color: #fff; }']);
    // Later writes (a resize, a new theme) replace the sheet's rules.
    el.textContent = '.xterm-rows { color: #000; }';
    expect(adopted.map((s) => s.text)).toEqual(['.xterm-rows { color: #000; }']);
    expect(el.textContent).toBe('.xterm-rows { color: #000; }');
    // Removing the element (the terminal's dispose) removes its sheet.
    el.remove();
    expect(adopted).toHaveLength(0);
    expect(host.children).toHaveLength(0);
  });

  it('makes other elements as usual and restores createElement, also after a throw', () => {
    const original = document.createElement;
    expect(withConstructedStyles(document, () => document.createElement('div').tagName)).toBe('DIV');
    expect(document.createElement).toBe(original);
    expect(() =>
      withConstructedStyles(document, () => {
        throw new Error('open failed');
      }),
    ).toThrow('open failed');
    expect(document.createElement).toBe(original);
    expect(document.createElement('style').tagName).toBe('STYLE');
  });
});
