// Builds elements without markup strings: text is always text, so nothing
// an API answer holds (a file name, a command's output) can become markup.

type Attrs = Record<string, string | boolean | ((e: Event) => void)>;
type Child = Node | string | null | undefined | false;

export function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (typeof v === "function") node.addEventListener(k.replace(/^on/, ""), v);
    else if (v === true) node.setAttribute(k, "");
    else if (v !== false) node.setAttribute(k, v);
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

/** Replaces the main area's content and moves focus there for keyboards. */
export function show(...children: Child[]): HTMLElement {
  const main = document.getElementById("main")!;
  main.replaceChildren(...(children.filter(Boolean) as (Node | string)[]));
  return main;
}

export function ago(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** A list table: its column headings, then `body` (rows a poll renders). */
export function listTable(id: string, headings: string[], body: HTMLTableSectionElement): HTMLTableElement {
  return el("table", { id, class: "list" }, el("thead", {}, el("tr", {}, ...headings.map((h) => el("th", { scope: "col" }, h)))), body);
}

/**
 * Re-renders a polled table without losing a keyboard user's place: the
 * element that had focus in it is found again in the new rows by its row's
 * `data-key` and its position among the row's controls.
 */
export function keepFocus(container: HTMLElement, render: () => void): void {
  const had = document.activeElement;
  const row = had instanceof HTMLElement && container.contains(had) ? had.closest<HTMLElement>("[data-key]") : null;
  const controls = (r: Element) => Array.from(r.querySelectorAll<HTMLElement>("a[href], button, input, [tabindex]"));
  const at = row ? controls(row).indexOf(had as HTMLElement) : -1;
  render();
  if (!row || at < 0) return;
  const again = Array.from(container.querySelectorAll<HTMLElement>("[data-key]")).find((r) => r.dataset.key === row.dataset.key);
  (again ? controls(again)[at] : undefined)?.focus();
}

/**
 * Tab and Shift+Tab go round the dialog's buttons rather than leaving it
 * (the page behind is inert while it is open); Escape cancels it, as a
 * modal dialog does.
 */
function trapFocus(dialog: HTMLDialogElement): void {
  if (dialog.dataset.trapped) return;
  dialog.dataset.trapped = "yes";
  dialog.addEventListener("keydown", (e) => {
    if (e.key !== "Tab") return;
    const stops = Array.from(dialog.querySelectorAll<HTMLElement>("button"));
    const first = stops[0];
    const last = stops[stops.length - 1];
    if (e.shiftKey && document.activeElement === first) {
      e.preventDefault();
      last.focus();
    } else if (!e.shiftKey && document.activeElement === last) {
      e.preventDefault();
      first.focus();
    }
  });
}

/**
 * Asks before a destructive action; resolves true only on the action
 * button. Focus starts on Cancel and goes back to where it was after.
 */
export function confirmAction(title: string, text: string, action: string): Promise<boolean> {
  const dialog = document.getElementById("confirm") as HTMLDialogElement;
  const before = document.activeElement;
  trapFocus(dialog);
  document.getElementById("confirm-title")!.textContent = title;
  document.getElementById("confirm-text")!.textContent = text;
  document.getElementById("confirm-ok")!.textContent = action;
  dialog.returnValue = "";
  dialog.showModal();
  (document.getElementById("confirm-cancel") as HTMLButtonElement).focus();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        if (before instanceof HTMLElement && before.isConnected) before.focus();
        resolve(dialog.returnValue === "ok");
      },
      { once: true },
    );
  });
}
