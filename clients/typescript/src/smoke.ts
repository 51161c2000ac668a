// Drives a real sandboxd through the client generated from docs/openapi.json
// (openapi-typescript types, openapi-fetch calls): create a sandbox, run a
// command and read its NDJSON log to the `exit` record, write and read a
// file, ask for a port URL, stop the sandbox. SANDBOXD_URL and
// SANDBOXD_TOKEN say where and how; any failure exits non-zero.

import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type LogRecord = components["schemas"]["LogRecord"];

const baseUrl = process.env.SANDBOXD_URL;
const token = process.env.SANDBOXD_TOKEN;
if (!baseUrl || !token) {
  throw new Error("set SANDBOXD_URL and SANDBOXD_TOKEN");
}

const client = createClient<paths>({
  baseUrl,
  headers: { "x-sandboxd-admin-token": token },
});

function check(cond: boolean, what: string): asserts cond {
  if (!cond) throw new Error(`smoke: ${what}`);
}

/** The data of a call, or a thrown error with the API's error body. */
function ok<T>(r: { data?: T; error?: unknown; response: Response }, what: string): T {
  if (r.data === undefined) {
    throw new Error(`smoke: ${what}: ${r.response.status} ${JSON.stringify(r.error)}`);
  }
  return r.data;
}

const health = ok(await client.GET("/v1/health"), "health");
check(health.ok, "health is ok");

const created = ok(
  await client.POST("/v1/sandboxes", {
    body: { sessionKey: `ts-smoke-${process.pid}-${Date.now()}`, ports: [3000] },
  }),
  "create",
);
check(created.created, "a new sandbox");
const id = created.sandboxId;
const sandbox = { params: { path: { id } } };

try {
  // A command, and its log stream read to the end.
  const started = ok(
    await client.POST("/v1/sandboxes/{id}/commands", {
      ...sandbox,
      body: { command: "echo hello; echo oops >&2; exit 3" },
    }),
    "start a command",
  );
  const cid = started.commandId;
  const logs = await client.GET("/v1/sandboxes/{id}/commands/{cid}/logs", {
    params: { path: { id, cid } },
    parseAs: "stream",
  });
  check(logs.response.ok && logs.data != null, `log stream: ${logs.response.status}`);
  check(
    logs.response.headers.get("content-type") === "application/x-ndjson",
    "the log stream is NDJSON",
  );
  const records: LogRecord[] = [];
  let pending = "";
  const decoder = new TextDecoder();
  for await (const chunk of logs.data as unknown as AsyncIterable<Uint8Array>) {
    pending += decoder.decode(chunk, { stream: true });
    const lines = pending.split("\n");
    pending = lines.pop() ?? "";
    records.push(...lines.filter((l) => l !== "").map((l) => JSON.parse(l) as LogRecord));
  }
  const stdout = records.flatMap((r) => (r.stream === "stdout" ? [r.data] : [])).join("");
  const stderr = records.flatMap((r) => (r.stream === "stderr" ? [r.data] : [])).join("");
  const exit = records.at(-1);
  check(stdout === "hello\n", `stdout ${JSON.stringify(stdout)}`);
  check(stderr === "oops\n", `stderr ${JSON.stringify(stderr)}`);
  check(exit?.stream === "exit" && exit.exitCode === 3, `last record ${JSON.stringify(exit)}`);

  const waited = ok(
    await client.GET("/v1/sandboxes/{id}/commands/{cid}/wait", { params: { path: { id, cid } } }),
    "wait",
  );
  check(waited.exitCode === 3 && !waited.timedOut, "wait agrees with the exit record");

  // A file written, read back, and seen by a command.
  const content = "written by the generated client\n";
  ok(
    await client.POST("/v1/sandboxes/{id}/files:write", {
      ...sandbox,
      body: {
        files: [{ path: "smoke/a.txt", contentBase64: Buffer.from(content).toString("base64") }],
      },
    }),
    "files:write",
  );
  const read = ok(
    await client.GET("/v1/sandboxes/{id}/files:read", {
      params: { path: { id }, query: { path: "/workspace/smoke/a.txt" } },
    }),
    "files:read",
  );
  check(
    read.found && Buffer.from(read.contentBase64 ?? "", "base64").toString() === content,
    "files:read gives back what was written",
  );
  const ran = ok(
    await client.POST("/v1/sandboxes/{id}/commands:run", {
      ...sandbox,
      body: { cmd: "cat", args: ["smoke/a.txt"] },
    }),
    "commands:run",
  );
  check(ran.exitCode === 0 && ran.stdout === content, `commands:run ${JSON.stringify(ran)}`);

  // A port URL.
  const port = ok(
    await client.GET("/v1/sandboxes/{id}/ports/{port}", {
      params: { path: { id, port: 3000 } },
    }),
    "port URL",
  );
  check(port.found && typeof port.url === "string" && port.url.startsWith("http"), `port ${JSON.stringify(port)}`);

  // The error shape, typed.
  const missing = await client.GET("/v1/sandboxes/{id}", {
    params: { path: { id: "0123456789abcdef01234567" } },
  });
  check(
    missing.response.status === 404 && missing.error?.code === "sandbox_not_found",
    `unknown sandbox ${JSON.stringify(missing.error)}`,
  );
} finally {
  const stopped = ok(await client.POST("/v1/sandboxes/{id}:stop", sandbox), "stop");
  check(stopped.ok, "stopped");
}

const gone = await client.GET("/v1/sandboxes/{id}", sandbox);
check(gone.error?.code === "sandbox_not_found", "the sandbox is gone after stop");
console.log("smoke: ok");
