// Builds the console into dist/: src/main.ts bundled (with @xterm/xterm and
// its fit addon) into app.js, the stylesheets into app.css, index.html and
// the icon.
// No source maps, no inline code: sandboxd serves dist/ under a CSP that
// allows only its own files (see src/api/ui.rs).
import { build } from "esbuild";
import { copyFile, mkdir, readFile, rm } from "node:fs/promises";

// xterm's DOM renderer writes its theme and cell-size rules into <style>
// elements and truecolor cells into style attributes, which the CSP
// (style-src 'self', no 'unsafe-inline') refuses. Its <style> elements are
// made as <sandboxd-xterm-style> instead, which src/terminal.ts defines to
// hold its rules in a constructed stylesheet, and the attribute is set
// through the CSSOM. Exact counts, so an xterm release that changes them
// fails here rather than in a browser.
const xtermUnderCsp = {
  name: "xterm-under-csp",
  setup(b) {
    b.onLoad({ filter: /@xterm[\\/]xterm[\\/]lib[\\/]xterm\.mjs$/ }, async (args) => {
      let code = await readFile(args.path, "utf8");
      const swap = (from, to, count) => {
        const found = code.split(from).length - 1;
        if (found !== count) {
          throw new Error(`xterm-under-csp: expected ${count} of ${from} in ${args.path}, found ${found}`);
        }
        code = code.split(from).join(to);
      };
      swap('createElement("style")', 'createElement("sandboxd-xterm-style")', 3);
      swap('t.setAttribute("style",`${t.getAttribute("style")||""}${e};`)', "t.style.cssText+=`${e};`", 1);
      return { contents: code, loader: "js" };
    });
  },
};

await rm("dist", { recursive: true, force: true });
await mkdir("dist");
await build({
  entryPoints: { app: "src/main.ts" },
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  outdir: "dist",
  plugins: [xtermUnderCsp],
  logLevel: "warning",
});
await copyFile("src/index.html", "dist/index.html");
await copyFile("src/icon.svg", "dist/icon.svg");
