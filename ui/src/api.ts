// sandboxd's public API as the console uses it: the admin token from this
// tab's session storage, sent in a header (never in a URL or a cookie).

const TOKEN_KEY = "sandboxd.adminToken";

export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value: string): void {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function clearToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** An error answer: its status and sandboxd's `code` and sentence. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** Called on a 401: the token was refused (wrong, or rotated). */
let onRefused: () => void = () => {};
export function whenRefused(f: () => void): void {
  onRefused = f;
}

async function send(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
  const headers: Record<string, string> = { "x-sandboxd-admin-token": token() ?? "" };
  if (body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: "omit",
    cache: "no-store",
  });
  if (!resp.ok) {
    let code = "http_" + resp.status;
    let message = resp.statusText;
    try {
      const e = await resp.json();
      code = e.code ?? code;
      message = e.error ?? message;
    } catch {
      // Not sandboxd's error shape: status text it is.
    }
    if (resp.status === 401) onRefused();
    throw new ApiError(resp.status, code, message);
  }
  return resp;
}

export async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  return (await send(method, path, body)).json() as Promise<T>;
}

export async function text(path: string): Promise<string> {
  return (await send("GET", path)).text();
}

/** Reads an NDJSON stream record by record until it ends or is aborted. */
export async function ndjson(path: string, signal: AbortSignal, each: (record: LogRecord) => void): Promise<void> {
  const resp = await send("GET", path, undefined, signal);
  const reader = resp.body!.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value;
    let nl: number;
    while ((nl = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      if (line.trim()) each(JSON.parse(line) as LogRecord);
    }
  }
}

export const enc = encodeURIComponent;

export interface Sandbox {
  sandboxId: string;
  sessionKey: string;
  runtime: string;
  state: string;
  createdAt: number;
  lastUsedAt: number;
  idleTtlMs: number;
  expiresAt: number;
  resources: { vcpus: number; memoryMb: number };
  network: { mode: string; allow?: string[] };
  ports: { allowed: number[]; published: Record<string, number> };
  runningCommands: number;
}

export interface Command {
  commandId: string;
  state: "running" | "exited";
  exitCode: number | null;
  timedOut: boolean | null;
  killed: boolean | null;
  startedAt: number;
  finishedAt: number | null;
  durationMs: number | null;
  summary: string;
  processes: number | null;
}

export interface LogRecord {
  stream: "stdout" | "stderr" | "dropped" | "heartbeat" | "error" | "exit";
  seq: number;
  data?: string;
  bytes?: number;
  message?: string;
  exitCode?: number;
  timedOut?: boolean;
  killed?: boolean;
  oomKilled?: boolean;
  usage?: { cpuUserMs: number; cpuSystemMs: number; maxRssKb: number };
}

export interface FileEntry {
  name: string;
  type: string;
  size: number;
  mtimeMs: number;
  mode: number;
}

export interface Pty {
  ptyId: string;
  command: string;
  createdAt: number;
  viewers: number;
  state: "running" | "exited";
  exitCode?: number;
  signal?: number;
}
