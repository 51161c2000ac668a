// The console's entry: a hash router over its pages (so sandboxd serves one
// page), the sign-in and refused pages, and the status view.
import "./style.css";
import { call, clearToken, setToken, text, token, whenRefused, ApiError } from "./api";
import { el, show } from "./dom";
import { sandboxesPage } from "./sandboxes";
import { sandboxPage } from "./sandbox";

/** What a page leaves running (polls, streams, sockets), stopped on leave. */
export type Cleanup = () => void;
let leave: Cleanup = () => {};

function nav(): void {
  const signedIn = token() !== null;
  document.getElementById("nav")!.replaceChildren(
    ...(signedIn
      ? [
          el("a", { href: "#/sandboxes" }, "Sandboxes"),
          el("a", { href: "#/status" }, "Status"),
          el("button", { type: "button", id: "sign-out", onclick: () => { clearToken(); location.hash = "#/signin"; } }, "Sign out"),
        ]
      : []),
  );
}

function route(): void {
  leave();
  leave = () => {};
  nav();
  const path = location.hash.replace(/^#/, "") || "/sandboxes";
  if (path === "/refused") return refusedPage();
  if (token() === null || path === "/signin") return signInPage();
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "sandboxes" && parts.length === 1) leave = sandboxesPage();
  else if (parts[0] === "sandboxes" && parts[1]) leave = sandboxPage(decodeURIComponent(parts[1]), parts[2] ?? "commands");
  else if (parts[0] === "status") statusPage();
  else location.hash = "#/sandboxes";
  document.getElementById("main")!.focus({ preventScroll: true });
}

function signInPage(): void {
  const input = el("input", { id: "token", type: "password", autocomplete: "current-password", required: true });
  const form = el(
    "form",
    {
      id: "signin",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        setToken(input.value);
        try {
          await call("GET", "/v1/sandboxes");
          // Signed in from #/sandboxes itself no hash change follows.
          if (location.hash === "#/sandboxes") route();
          else location.hash = "#/sandboxes";
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 401)) {
            clearToken();
            form.append(el("p", { class: "error", role: "alert" }, `sandboxd did not answer: ${String(err)}`));
          }
        }
      },
    },
    el("h1", {}, "Sign in"),
    el("p", {}, "The admin token sandboxd was started with (SANDBOXD_ADMIN_TOKEN). It stays in this tab only."),
    el("label", { for: "token" }, "Admin token"),
    input,
    el("button", { type: "submit" }, "Sign in"),
  );
  show(form);
  input.focus();
}

function refusedPage(): void {
  show(
    el(
      "section",
      { id: "refused" },
      el("h1", {}, "Token refused"),
      el("p", {}, "sandboxd answered 401 unauthorized: this is not its admin token (or the token changed). Nothing was done with it."),
      el("a", { href: "#/signin", class: "button", id: "try-again" }, "Sign in again"),
    ),
  );
}

whenRefused(() => {
  clearToken();
  location.hash = "#/refused";
});

/** Engine, version and pool from /v1/health and /metrics. */
async function statusPage(): Promise<void> {
  show(el("h1", {}, "Status"), el("p", {}, "Loading…"));
  try {
    const [health, metrics] = await Promise.all([
      fetch("/v1/health", { cache: "no-store" }).then((r) => r.json()),
      text("/metrics"),
    ]);
    const samples = parseMetrics(metrics);
    const sum = (name: string, label?: string) =>
      samples.filter((s) => s.name === name && (!label || s.labels.includes(label))).reduce((a, s) => a + s.value, 0);
    const rows: [string, string][] = [
      ["Engine", `${health.engine} ${health.version ?? ""}${health.ok ? "" : ` (not answering: ${health.error})`}`],
      ["Sandboxes", String(sum("sandboxd_sandboxes"))],
      ["Commands running", String(sum("sandboxd_commands_running"))],
      ["Commands started", String(sum("sandboxd_commands_started_total"))],
      ["Pool members ready", String(sum("sandboxd_pool_members", 'state="ready"'))],
      ["Pool members filling", String(sum("sandboxd_pool_members", 'state="filling"'))],
      ["Pool target", String(sum("sandboxd_pool_target"))],
      ["Pool claims (hit / miss)", `${sum("sandboxd_pool_claims_total", 'outcome="hit"')} / ${sum("sandboxd_pool_claims_total", 'outcome="miss"')}`],
      ["Terminal sessions opened", String(sum("sandboxd_ptys_opened_total"))],
      ["Engine errors", String(sum("sandboxd_engine_errors_total"))],
    ];
    show(
      el("h1", {}, "Status"),
      el("table", { id: "status", class: "facts" }, ...rows.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, v)))),
    );
  } catch (err) {
    show(el("h1", {}, "Status"), el("p", { class: "error", role: "alert" }, String(err)));
  }
}

function parseMetrics(body: string): { name: string; labels: string; value: number }[] {
  return body
    .split("\n")
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => {
      const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(l);
      return m ? { name: m[1], labels: m[2] ?? "", value: Number(m[3]) } : null;
    })
    .filter((s): s is { name: string; labels: string; value: number } => s !== null);
}

// The skip link's #main would be taken for a route: it moves focus itself.
document.querySelector(".skip")!.addEventListener("click", (e) => {
  e.preventDefault();
  document.getElementById("main")!.focus();
});

window.addEventListener("hashchange", route);
route();
