// One sandbox: its facts and lifecycle buttons, then a tab each for its
// commands (with a live log), files, terminal, port URLs and checkpoints.
import { ApiError, call, enc, ndjson, type Command, type FileEntry, type LogRecord, type Sandbox } from "./api";
import { checkpointsTab } from "./checkpoints";
import { ago, el, keepFocus, listTable, show } from "./dom";
import type { Cleanup } from "./main";
import { lifecycleButtons } from "./sandboxes";
import { terminalTab } from "./terminal";

const TABS = ["commands", "files", "terminal", "ports", "checkpoints"] as const;

export function sandboxPage(id: string, tab: string): Cleanup {
  const base = `/v1/sandboxes/${enc(id)}`;
  const panel = el("section", { id: `tab-${tab}`, class: "panel" });
  const head = el("div", { class: "sandbox-head" }, el("h1", {}, "Sandbox"), el("p", { class: "muted mono" }, id));
  show(
    el("p", {}, el("a", { href: "#/sandboxes" }, "← All sandboxes")),
    head,
    el(
      "nav",
      { class: "tabs", "aria-label": "Sandbox" },
      ...TABS.map((t) => el("a", { href: `#/sandboxes/${enc(id)}/${t}`, id: `to-${t}`, "aria-current": t === tab ? "page" : false }, t[0].toUpperCase() + t.slice(1))),
    ),
    panel,
  );
  let cleanup: Cleanup = () => {};
  call<Sandbox>("GET", base)
    .then((s) => {
      head.replaceChildren(
        el("h1", {}, s.sessionKey),
        el("p", { class: "muted mono" }, s.sandboxId),
        el(
          "p",
          { class: "facts-line" },
          `${s.runtime} · ${s.network.mode} network · ${s.resources.vcpus} vCPU, ${s.resources.memoryMb} MB · expires in ${ago(s.expiresAt - Date.now())}`,
        ),
        el("div", { class: "actions" }, ...lifecycleButtons(s, () => (location.hash = "#/sandboxes"))),
      );
      if (tab === "ports") portsTab(panel, base, s);
    })
    .catch((err) => {
      head.append(el("p", { class: "error", role: "alert", id: "sandbox-error" }, err instanceof ApiError && err.status === 404 ? "No such sandbox (stopped, expired or never made)." : String(err)));
    });
  if (tab === "commands") cleanup = commandsTab(panel, base);
  else if (tab === "files") filesTab(panel, base, "/workspace");
  else if (tab === "terminal") cleanup = terminalTab(panel, id);
  else if (tab === "checkpoints") cleanup = checkpointsTab(panel, base);
  return () => cleanup();
}

function commandsTab(panel: HTMLElement, base: string): Cleanup {
  const body = el("tbody", {});
  const log = el("pre", { id: "log", class: "log", tabindex: "0", "aria-live": "off" });
  const logHead = el("p", { id: "log-head", class: "muted" }, "Choose a command to see its output.");
  let stream: AbortController | null = null;
  let shown = "";
  let timer = 0;
  let stopped = false;

  const follow = (c: Command) => {
    stream?.abort();
    stream = new AbortController();
    log.replaceChildren();
    logHead.textContent = `${c.summary} — ${c.state === "running" ? "running, following live" : "finished, retained output"}`;
    const append = (r: LogRecord) => {
      const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      if (r.stream === "stdout" || r.stream === "stderr") log.append(el("span", { class: r.stream }, r.data ?? ""));
      else if (r.stream === "dropped") log.append(el("span", { class: "note" }, `[${r.bytes} bytes dropped]\n`));
      else if (r.stream === "error") log.append(el("span", { class: "note" }, `[${r.message}]\n`));
      else if (r.stream === "exit") {
        const usage = r.usage ? `, cpu ${r.usage.cpuUserMs + r.usage.cpuSystemMs} ms, max RSS ${r.usage.maxRssKb} KiB` : "";
        const flags = [r.timedOut && "timed out", r.killed && "killed", r.oomKilled && "OOM-killed"].filter(Boolean).join(", ");
        log.append(el("span", { class: "note exit" }, `[exit ${r.exitCode}${flags ? ` (${flags})` : ""}${usage}]\n`));
      }
      if (atEnd) log.scrollTop = log.scrollHeight;
    };
    ndjson(`${base}/commands/${enc(c.commandId)}/logs`, stream.signal, append).catch((err) => {
      if (!(err instanceof DOMException && err.name === "AbortError")) log.append(el("span", { class: "note" }, `[${String(err)}]\n`));
    });
  };

  const refresh = async () => {
    try {
      const { commands } = await call<{ commands: Command[] }>("GET", `${base}/commands`);
      const now = Date.now();
      const seen = JSON.stringify(commands);
      if (seen !== shown || !body.contains(document.activeElement)) {
        shown = seen;
        keepFocus(body, () =>
          body.replaceChildren(
            ...commands
              .slice()
              .reverse()
              .map((c) =>
                el(
                  "tr",
                  { "data-command": c.commandId, "data-key": c.commandId },
                el("td", { "data-label": "Command" }, el("button", { type: "button", class: "link", onclick: () => follow(c) }, c.summary || c.commandId)),
                el("td", { "data-label": "State" }, c.state),
                el("td", { "data-label": "Exit" }, c.exitCode === null ? "–" : `${c.exitCode}${c.timedOut ? " (timed out)" : ""}${c.killed ? " (killed)" : ""}`),
                el("td", { "data-label": "Duration" }, c.durationMs === null ? ago(now - c.startedAt) : `${c.durationMs} ms`),
                el("td", { "data-label": "Processes" }, c.processes === null ? "?" : String(c.processes)),
                ),
              ),
          ),
        );
      }
    } catch (err) {
      logHead.textContent = String(err);
    }
    if (!stopped) timer = window.setTimeout(refresh, 2000);
  };
  panel.append(
    el("h2", {}, "Commands"),
    listTable("commands", ["Command", "State", "Exit", "Duration", "Processes"], body),
    el("h2", {}, "Output"),
    logHead,
    log,
  );
  void refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
    stream?.abort();
  };
}

function filesTab(panel: HTMLElement, base: string, dir: string, message = ""): void {
  const listing = el("ul", { id: "files", class: "files" });
  const viewer = el("section", { id: "viewer" });
  const upload = el("input", { type: "file", id: "upload", multiple: true });
  const note = el("p", { class: "muted", role: "status", id: "files-status" }, message);
  const join = (name: string) => (dir.endsWith("/") ? dir + name : `${dir}/${name}`);

  const open = (path: string, said = "") => {
    panel.replaceChildren();
    filesTab(panel, base, path, said);
  };

  const view = async (entry: FileEntry) => {
    const path = join(entry.name);
    const read = await call<{ found: boolean; contentBase64?: string }>("GET", `${base}/files:read?path=${enc(path)}`);
    if (!read.found) {
      viewer.replaceChildren(el("p", { class: "error" }, `${path} is gone.`));
      return;
    }
    const bytes = fromBase64(read.contentBase64 ?? "");
    const blob = URL.createObjectURL(new Blob([bytes]));
    let body: HTMLElement;
    try {
      body = el("pre", { id: "file-text", class: "log", tabindex: "0" }, new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    } catch {
      body = el("p", {}, `Binary file, ${bytes.length} bytes.`);
    }
    viewer.replaceChildren(el("h3", {}, path), el("a", { href: blob, download: entry.name, class: "button", id: "download" }, "Download"), body);
  };

  upload.addEventListener("change", async () => {
    const files = Array.from(upload.files ?? []);
    try {
      const written = await Promise.all(files.map(async (f) => ({ path: join(f.name), contentBase64: toBase64(new Uint8Array(await f.arrayBuffer())) })));
      await call("POST", `${base}/files:write`, { files: written });
      open(dir, `Uploaded ${files.map((f) => f.name).join(", ")}.`);
    } catch (err) {
      note.textContent = `Upload failed: ${String(err)}`;
    }
  });

  const parent = dir.replace(/\/[^/]+\/?$/, "") || "/";
  panel.append(
    el("h2", {}, "Files"),
    el("p", { class: "mono", id: "cwd" }, dir),
    el("label", { for: "upload" }, `Upload into ${dir}`),
    upload,
    note,
    listing,
    viewer,
  );
  call<{ entries: FileEntry[] }>("GET", `${base}/files:list?path=${enc(dir)}`)
    .then(({ entries }) => {
      const up = dir === "/workspace" ? [] : [el("li", {}, el("button", { type: "button", class: "link", onclick: () => open(parent) }, "../"))];
      listing.replaceChildren(
        ...up,
        ...entries
          .sort((a, b) => Number(b.type === "dir") - Number(a.type === "dir") || a.name.localeCompare(b.name))
          .map((e) =>
            el(
              "li",
              { "data-file": e.name },
              el("button", { type: "button", class: "link", onclick: () => (e.type === "dir" ? open(join(e.name)) : void view(e)) }, e.type === "dir" ? `${e.name}/` : e.name),
              el("span", { class: "muted" }, e.type === "dir" ? "" : ` ${e.size} bytes`),
            ),
          ),
      );
    })
    .catch((err) => listing.replaceChildren(el("li", { class: "error" }, String(err))));
}

function portsTab(panel: HTMLElement, base: string, s: Sandbox): void {
  const list = el("ul", { id: "ports" });
  panel.append(el("h2", {}, "Ports"), list);
  if (s.ports.allowed.length === 0) list.append(el("li", {}, "This sandbox was created without ports."));
  for (const port of s.ports.allowed) {
    const item = el("li", { "data-port": String(port) }, `${port}: …`);
    list.append(item);
    call<{ found: boolean; url?: string }>("GET", `${base}/ports/${port}`)
      .then((p) => item.replaceChildren(`${port}: `, p.found && p.url ? el("a", { href: p.url, target: "_blank", rel: "noopener noreferrer" }, p.url) : "not published"))
      .catch((err) => item.replaceChildren(`${port}: ${String(err)}`));
  }
}

function fromBase64(b64: string): Uint8Array<ArrayBuffer> {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function toBase64(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}
