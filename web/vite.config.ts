import { defineConfig } from 'vite';
import preact from '@preact/preset-vite';

// The build goes to dist/, which is committed and embedded in the rlark binary
// (crates/rlark-server/build.rs). No inline scripts: the server's Content-Security-Policy
// allows only 'self'.
export default defineConfig({
  plugins: [preact()],
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    modulePreload: { polyfill: false },
    sourcemap: false,
    chunkSizeWarningLimit: 300,
  },
  test: {
    environment: 'jsdom',
    include: ['src/**/*.test.ts', 'src/**/*.test.tsx'],
  },
});
