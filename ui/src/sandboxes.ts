// The sandboxes list: polled every 2 s, filtered by session key, with stop
// and restart behind a confirmation.
import { call, enc, type Sandbox } from "./api";
import { ago, confirmAction, el, keepFocus, listTable, show } from "./dom";
import type { Cleanup } from "./main";

const POLL_MS = 2000;

export function sandboxesPage(): Cleanup {
  const filter = el("input", { id: "filter", type: "search", placeholder: "session key contains…" });
  const body = el("tbody", {});
  const status = el("p", { class: "muted", "aria-live": "polite" });
  let sandboxes: Sandbox[] = [];
  let timer = 0;
  let stopped = false;

  const render = () => {
    const needle = filter.value.trim().toLowerCase();
    const now = Date.now();
    const shown = sandboxes.filter((s) => s.sessionKey.toLowerCase().includes(needle));
    status.textContent = `${shown.length} of ${sandboxes.length} sandboxes`;
    keepFocus(body, () =>
      body.replaceChildren(
        ...shown.map((s) =>
          el(
            "tr",
            { "data-sandbox": s.sandboxId, "data-key": s.sandboxId },
          el("td", { "data-label": "Session" }, el("a", { href: `#/sandboxes/${enc(s.sandboxId)}` }, s.sessionKey), el("div", { class: "muted mono" }, s.sandboxId)),
          el("td", { "data-label": "Runtime" }, s.runtime),
          el("td", { "data-label": "State" }, s.state),
          el("td", { "data-label": "Age" }, ago(now - s.createdAt)),
          el("td", { "data-label": "Idle" }, ago(now - s.lastUsedAt)),
          el("td", { "data-label": "Expires in" }, ago(s.expiresAt - now)),
          el("td", { "data-label": "Resources" }, `${s.resources.vcpus} vCPU, ${s.resources.memoryMb} MB`),
          el("td", { "data-label": "Network" }, s.network.mode),
          el("td", { "data-label": "Ports" }, s.ports.allowed.join(", ") || "–"),
          el("td", { "data-label": "Running" }, String(s.runningCommands)),
          el("td", { class: "actions" }, ...lifecycleButtons(s, refresh)),
          ),
        ),
      ),
    );
  };

  const refresh = async () => {
    try {
      const list = (await call<{ sandboxes: Sandbox[] }>("GET", "/v1/sandboxes")).sandboxes;
      // Ages change with every poll: rendered again each time, focus kept.
      sandboxes = list;
      render();
    } catch (err) {
      status.textContent = `Could not list: ${String(err)}`;
    }
  };

  const poll = async () => {
    await refresh();
    if (!stopped) timer = window.setTimeout(poll, POLL_MS);
  };

  filter.addEventListener("input", render);
  show(
    el("h1", {}, "Sandboxes"),
    el("label", { for: "filter" }, "Filter by session key"),
    filter,
    status,
    listTable("sandboxes", ["Session", "Runtime", "State", "Age", "Idle", "Expires in", "Resources", "Network", "Ports", "Running", ""], body),
  );
  void poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** Restart and stop buttons, each asking first; `after` runs once done. */
export function lifecycleButtons(s: Sandbox, after: () => void): HTMLButtonElement[] {
  const act = (action: "stop" | "restart") => async () => {
    const ok = await confirmAction(
      action === "stop" ? "Stop this sandbox?" : "Restart this sandbox?",
      action === "stop"
        ? `Session ${s.sessionKey}: its container, ports and workspace are removed. This cannot be undone.`
        : `Session ${s.sessionKey}: every process in it ends; the workspace stays.`,
      action === "stop" ? "Stop sandbox" : "Restart sandbox",
    );
    if (!ok) return;
    await call("POST", `/v1/sandboxes/${enc(s.sandboxId)}:${action}`);
    after();
  };
  return [
    el("button", { type: "button", class: "restart", onclick: act("restart") }, "Restart"),
    el("button", { type: "button", class: "stop danger", onclick: act("stop") }, "Stop"),
  ];
}
