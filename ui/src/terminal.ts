// The terminal tab: a PTY session attached over a WebSocket with a
// single-use ticket (a browser cannot send the token header on one),
// resized with the window, detached and attached again with scrollback.
import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import "@xterm/xterm/css/xterm.css";
import { call, enc, type Pty } from "./api";
import { el } from "./dom";
import type { Cleanup } from "./main";

/**
 * xterm's own rules (theme, cell size), which build.mjs redirects from
 * <style> elements (refused by the CSP) to this element: it keeps them in a
 * constructed stylesheet, adopted by the document while it is connected.
 */
class XtermStyle extends HTMLElement {
  private readonly sheet = new CSSStyleSheet();
  private rules = "";
  override get textContent(): string {
    return this.rules;
  }
  override set textContent(rules: string | null) {
    this.rules = rules ?? "";
    this.sheet.replaceSync(this.rules);
  }
  connectedCallback(): void {
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, this.sheet];
  }
  disconnectedCallback(): void {
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== this.sheet);
  }
}
if (!customElements.get("sandboxd-xterm-style")) customElements.define("sandboxd-xterm-style", XtermStyle);

export function terminalTab(panel: HTMLElement, id: string): Cleanup {
  const base = `/v1/sandboxes/${enc(id)}/ptys`;
  const sessions = el("ul", { id: "ptys" });
  const state = el("p", { id: "term-state", class: "muted", role: "status" }, "Not attached.");
  const screen = el("div", { id: "terminal", class: "terminal" });
  let detach: () => void = () => {};

  const attach = async (ptyId: string) => {
    detach();
    const { ticket } = await call<{ ticket: string }>("POST", `${base}/${enc(ptyId)}:ticket`);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}${base}/${enc(ptyId)}?ticket=${enc(ticket)}`);
    ws.binaryType = "arraybuffer";
    const term = new Terminal({ cursorBlink: true, fontFamily: "monospace", fontSize: 14, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    screen.replaceChildren();
    term.open(screen);
    // Tab belongs to the shell (completion); Shift+Tab leaves the terminal
    // for the Detach button, so a keyboard is never caught in it.
    term.attachCustomKeyEventHandler((e) => {
      if (e.key !== "Tab" || !e.shiftKey) return true;
      if (e.type === "keydown") {
        e.preventDefault();
        off.focus();
      }
      return false;
    });
    const encoder = new TextEncoder();
    const resize = () => {
      fit.fit();
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    };
    const observer = new ResizeObserver(() => resize());
    ws.addEventListener("open", () => {
      state.textContent = `Attached to ${ptyId}.`;
      observer.observe(screen);
      resize();
      term.focus();
    });
    ws.addEventListener("message", (m) => {
      if (typeof m.data === "string") {
        const msg = JSON.parse(m.data);
        if (msg.type === "writer") state.textContent = msg.writer ? `Attached to ${ptyId}; typing goes in.` : `Watching ${ptyId}; another viewer types.`;
        else if (msg.type === "exit") state.textContent = `The session ended (${msg.exitCode !== undefined ? `exit ${msg.exitCode}` : `signal ${msg.signal}`}).`;
        else if (msg.type === "lagged") term.write(`\r\n[${msg.skippedBytes} bytes skipped]\r\n`);
      } else term.write(new Uint8Array(m.data as ArrayBuffer));
    });
    ws.addEventListener("close", () => {
      if (!state.textContent?.startsWith("The session ended")) state.textContent = "Detached.";
      void list();
    });
    const input = term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(encoder.encode(d)));
    detach = () => {
      input.dispose();
      observer.disconnect();
      ws.close(1000);
      term.dispose();
      detach = () => {};
    };
  };

  const list = async () => {
    const { ptys } = await call<{ ptys: Pty[] }>("GET", base);
    sessions.replaceChildren(
      ...ptys.map((p) =>
        el(
          "li",
          { "data-pty": p.ptyId },
          `${p.command} · ${p.state}${p.state === "exited" ? ` (${p.exitCode ?? `signal ${p.signal}`})` : ""} · ${p.viewers} viewer(s) `,
          p.state === "running" ? el("button", { type: "button", class: "attach", onclick: () => void attach(p.ptyId) }, "Attach") : null,
        ),
      ),
    );
  };

  const open = el(
    "button",
    {
      type: "button",
      id: "new-terminal",
      onclick: async () => {
        const { ptyId } = await call<{ ptyId: string }>("POST", base, { cols: 100, rows: 30 });
        await attach(ptyId);
        await list();
      },
    },
    "New terminal",
  );
  const off = el("button", { type: "button", id: "detach", onclick: () => detach() }, "Detach");
  panel.append(el("h2", {}, "Terminal"), el("div", { class: "actions" }, open, off), state, screen, el("h3", {}, "Sessions"), sessions);
  void list();
  return () => detach();
}
