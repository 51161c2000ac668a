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

/** Asks before a destructive action; resolves true only on the action button. */
export function confirmAction(title: string, text: string, action: string): Promise<boolean> {
  const dialog = document.getElementById("confirm") as HTMLDialogElement;
  document.getElementById("confirm-title")!.textContent = title;
  document.getElementById("confirm-text")!.textContent = text;
  document.getElementById("confirm-ok")!.textContent = action;
  dialog.returnValue = "";
  dialog.showModal();
  (document.getElementById("confirm-cancel") as HTMLButtonElement).focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}
