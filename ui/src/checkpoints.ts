// The checkpoints tab: a sandbox's checkpoints (newest first), taking one,
// its diff against the workspace now, and restore and delete behind a
// confirmation; a restore refused for running commands asks a second time
// whether to end them.
import { ApiError, call, enc } from "./api";
import { ago, confirmAction, el, keepFocus, listTable } from "./dom";
import type { Cleanup } from "./main";

const POLL_MS = 3000;

interface Checkpoint {
  checkpointId: string;
  label: string | null;
  createdAt: number;
  files: number;
  bytes: number;
}

interface ChangedPath {
  path: string;
  kind: "file" | "dir" | "symlink";
  sizeBefore: number | null;
  sizeAfter: number | null;
}

interface Diff {
  created: ChangedPath[];
  modified: ChangedPath[];
  deleted: ChangedPath[];
  counts: { created: number; modified: number; deleted: number };
  truncated: boolean;
}

/** A byte count as people read it (exact below a KiB). */
export function size(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(1)} ${units[u]}`;
}

/** The API's own sentence for a refusal, else what went wrong. */
function reason(err: unknown): string {
  return err instanceof ApiError ? err.message : String(err);
}

export function checkpointsTab(panel: HTMLElement, base: string): Cleanup {
  const url = `${base}/checkpoints`;
  const label = el("input", { id: "checkpoint-label", type: "text", maxlength: "256", autocomplete: "off" });
  const body = el("tbody", {});
  const status = el("p", { id: "checkpoints-status", class: "muted", role: "status" });
  const diff = el("section", { id: "diff", "aria-live": "polite" });
  let shown = "";
  let timer = 0;
  let stopped = false;

  const said = (text: string, error = false) => {
    status.textContent = text;
    status.className = error ? "error" : "muted";
  };

  const name = (c: Checkpoint) => c.label ?? c.checkpointId;

  const showDiff = (title: string, d: Diff) => {
    const group = (kind: "created" | "modified" | "deleted", list: ChangedPath[], count: number) =>
      el(
        "div",
        { class: "diff-group" },
        el("h4", {}, `${kind[0].toUpperCase()}${kind.slice(1)} (${count})`),
        list.length === 0
          ? el("p", { class: "muted" }, "none")
          : el(
              "ul",
              { id: `diff-${kind}`, class: "files" },
              ...list.map((p) =>
                el(
                  "li",
                  { "data-path": p.path, class: `change-${kind}` },
                  el("span", { class: "mono" }, p.kind === "dir" ? `${p.path}/` : p.path),
                  el("span", { class: "muted" }, sizes(p)),
                ),
              ),
            ),
      );
    diff.replaceChildren(
      el("h3", {}, title),
      group("created", d.created, d.counts.created),
      group("modified", d.modified, d.counts.modified),
      group("deleted", d.deleted, d.counts.deleted),
    );
    if (d.truncated) diff.append(el("p", { class: "muted" }, "Each list shows its first 1000 paths; the counts are exact."));
  };

  const compare = async (c: Checkpoint) => {
    try {
      const d = await call<Diff>("GET", `${url}/${enc(c.checkpointId)}/diff?to=current`);
      showDiff(`From ${name(c)} to the workspace now`, d);
    } catch (err) {
      said(`Could not compare: ${reason(err)}`, true);
    }
  };

  const restore = async (c: Checkpoint) => {
    const ok = await confirmAction(
      "Restore this checkpoint?",
      `The workspace becomes exactly ${name(c)}: files changed since get its content back, and files made since are deleted.`,
      "Restore",
    );
    if (!ok) return;
    const send = (endCommands: boolean) => call<Diff>("POST", `${url}/${enc(c.checkpointId)}:restore`, { endCommands });
    try {
      let changed: Diff;
      try {
        changed = await send(false);
      } catch (err) {
        if (!(err instanceof ApiError && err.code === "commands_running")) throw err;
        const end = await confirmAction(
          "Commands are running",
          `${err.message}. End them (SIGTERM, then SIGKILL) and restore?`,
          "End commands and restore",
        );
        if (!end) {
          said("Not restored: commands are running.");
          return;
        }
        changed = await send(true);
      }
      said(`Restored ${name(c)}.`);
      showDiff(`What the restore changed`, changed);
    } catch (err) {
      said(`Could not restore: ${reason(err)}`, true);
    }
  };

  const remove = async (c: Checkpoint) => {
    const ok = await confirmAction("Delete this checkpoint?", `${name(c)} is deleted; the workspace stays as it is.`, "Delete checkpoint");
    if (!ok) return;
    try {
      await call("DELETE", `${url}/${enc(c.checkpointId)}`);
      said(`Deleted ${name(c)}.`);
      diff.replaceChildren();
    } catch (err) {
      said(`Could not delete: ${reason(err)}`, true);
    }
    await refresh();
  };

  const render = (all: Checkpoint[]) => keepFocus(body, () => rows(all));

  const rows = (all: Checkpoint[]) => {
    const now = Date.now();
    body.replaceChildren(
      ...all.map((c) =>
        el(
          "tr",
          { "data-checkpoint": c.checkpointId, "data-key": c.checkpointId },
          el("td", { "data-label": "Label" }, c.label ?? el("span", { class: "muted" }, "none"), el("div", { class: "muted mono" }, c.checkpointId)),
          el("td", { "data-label": "Taken" }, new Date(c.createdAt).toLocaleString(), el("div", { class: "muted" }, `${ago(now - c.createdAt)} ago`)),
          el("td", { "data-label": "Files" }, String(c.files)),
          el("td", { "data-label": "Bytes" }, size(c.bytes)),
          el(
            "td",
            {},
            el(
              "div",
              { class: "actions" },
              el("button", { type: "button", class: "diff", onclick: () => void compare(c) }, "Diff with now"),
              el("button", { type: "button", class: "restore danger", onclick: () => void restore(c) }, "Restore"),
              el("button", { type: "button", class: "delete danger", onclick: () => void remove(c) }, "Delete"),
            ),
          ),
        ),
      ),
    );
    if (all.length === 0) body.append(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "No checkpoints yet.")));
  };

  const refresh = async () => {
    try {
      const { checkpoints } = await call<{ checkpoints: Checkpoint[] }>("GET", url);
      const seen = JSON.stringify(checkpoints);
      if (seen !== shown) {
        shown = seen;
        render(checkpoints);
      }
    } catch (err) {
      said(`Could not list: ${reason(err)}`, true);
    }
  };

  const poll = async () => {
    await refresh();
    if (!stopped) timer = window.setTimeout(poll, POLL_MS);
  };

  const form = el(
    "form",
    {
      id: "take",
      class: "inline-form",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        said("Taking a checkpoint…");
        try {
          const made = await call<Checkpoint>("POST", url, label.value.trim() ? { label: label.value.trim() } : {});
          label.value = "";
          said(`Took ${name(made)}: ${made.files} files, ${size(made.bytes)}.`);
        } catch (err) {
          said(`Could not take a checkpoint: ${reason(err)}`, true);
        }
        await refresh();
      },
    },
    el("label", { for: "checkpoint-label" }, "Label (optional)"),
    label,
    el("button", { type: "submit", id: "take-checkpoint" }, "Take checkpoint"),
  );
  panel.append(
    el("h2", {}, "Checkpoints"),
    form,
    status,
    listTable("checkpoints", ["Label", "Taken", "Files", "Bytes", ""], body),
    diff,
  );
  void poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function sizes(p: ChangedPath): string {
  if (p.sizeBefore === null && p.sizeAfter === null) return "";
  if (p.sizeBefore === null) return ` ${size(p.sizeAfter ?? 0)}`;
  if (p.sizeAfter === null) return ` was ${size(p.sizeBefore)}`;
  return ` ${size(p.sizeBefore)} → ${size(p.sizeAfter)}`;
}
