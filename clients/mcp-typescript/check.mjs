// The official MCP TypeScript SDK's client against one chat session's MCP
// endpoint of a real sandboxd. Each check prints `ok <name>` when it
// passes; the first that fails prints why and exits 1. tests/it/mcp_typescript.rs
// runs it and asserts every name printed.
//
// Environment: SANDBOXD_MCP_URL (the endpoint, with `?ports=3000` so the
// port check can publish), SANDBOXD_TOKEN (sent as a bearer token),
// CHECKS=smoke for the short run (initialize, tools, bash, files).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.env.SANDBOXD_MCP_URL;
const token = process.env.SANDBOXD_TOKEN;
const smoke = process.env.CHECKS === "smoke";
if (!url) {
  console.error("SANDBOXD_MCP_URL is not set");
  process.exit(2);
}

const TOOLS = [
  "bash", "createCheckpoint", "diffCheckpoint", "editFile", "listCheckpoints", "listFiles",
  "readFile", "restoreCheckpoint", "sandboxUrl", "searchFiles", "writeFile",
];

function fail(why, detail) {
  throw new Error(`${why}: ${JSON.stringify(detail)}`);
}

function text(result) {
  return (result.content ?? [])
    .filter((c) => c.type === "text")
    .map((c) => c.text)
    .join("\n");
}

async function connect() {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  const client = new Client({ name: "sandboxd-ts-check", version: "1.0.0" });
  await client.connect(transport);
  console.log(`info protocol ${transport.protocolVersion}`);
  return client;
}

async function call(client, name, args, options) {
  return client.callTool({ name, arguments: args }, undefined, options);
}

async function bash(client, command) {
  const r = await call(client, "bash", { command });
  if (r.isError) fail(`bash ${command}`, r);
  return r;
}

async function eventually(what, seconds, probe) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    if (await probe()) return;
    if (Date.now() > deadline) fail(`not within ${seconds} s`, what);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const client = await connect();
const server = client.getServerVersion();
if (server?.name !== "sandboxd") fail("server name", server);
if (!(client.getInstructions() ?? "").includes("sandboxUrl")) fail("instructions name sandboxUrl", client.getInstructions());
console.log("ok initialize");

const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort();
if (JSON.stringify(names) !== JSON.stringify(TOOLS)) fail("tool names", names);
for (const t of tools) {
  if (t.inputSchema?.type !== "object" || !t.description) fail("tool schema and description", t);
}
console.log("ok tools");

const echoed = await bash(client, "echo hello-from-ts");
if (!text(echoed).includes("hello-from-ts")) fail("bash output", echoed);
console.log("ok bash");

const written = await call(client, "writeFile", { path: "ts/a.txt", content: "from-ts\n" });
if (written.isError) fail("writeFile", written);
if (!text(await bash(client, "cat ts/a.txt")).includes("from-ts")) fail("bash reads what writeFile wrote", written);
await bash(client, "printf 'from-bash\\n' > ts/b.txt");
const read = await call(client, "readFile", { path: "ts/b.txt" });
if (read.isError || !text(read).includes("from-bash")) fail("readFile reads what bash wrote", read);
console.log("ok files");

if (!smoke) {
  // editFile: zero matches is a tool error that changes nothing.
  const missed = await call(client, "editFile", { path: "ts/a.txt", oldText: "not-there", newText: "x" });
  if (!missed.isError) fail("editFile with no match is a tool error", missed);
  const edited = await call(client, "editFile", { path: "ts/a.txt", oldText: "from-ts", newText: "edited-ts" });
  if (edited.isError) fail("editFile with one match", edited);
  if (!text(await bash(client, "cat ts/a.txt")).includes("edited-ts")) fail("the edit is in the file", edited);
  console.log("ok editFile");

  // Bad arguments and a path out of the workspace are tool errors.
  const bad = await call(client, "readFile", {});
  const out = await call(client, "readFile", { path: "../../etc/passwd" });
  if (!bad.isError || !out.isError) fail("bad arguments are tool errors", { bad, out });
  console.log("ok errors");

  // Progress notifications carry partial output while bash runs.
  const progress = [];
  const ticked = await call(
    client,
    "bash",
    { command: "for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.5; done" },
    { onprogress: (p) => progress.push(p), timeout: 60000 },
  );
  if (ticked.isError || !text(ticked).includes("tick-6")) fail("the ticking command", ticked);
  if (!progress.some((p) => JSON.stringify(p).includes("tick-"))) fail("progress with partial output", progress);
  console.log("ok progress");

  // Cancelling a call kills the command's whole tree.
  const procs = "pgrep -f 'sleep 300[12]' | wc -l";
  const abort = new AbortController();
  const running = call(client, "bash", { command: "sleep 3001 & sleep 3002" }, { signal: abort.signal, timeout: 120000 });
  running.catch(() => {});
  await eventually("the command's processes run (the positive control)", 20, async () => {
    return Number(text(await bash(client, procs)).trim().split(/\s+/)[0]) >= 2;
  });
  abort.abort();
  await running.then(
    () => fail("the cancelled call resolved", {}),
    () => {},
  );
  await eventually("no process of the cancelled command is left", 20, async () => {
    return text(await bash(client, procs)).trim().startsWith("0");
  });
  console.log("ok cancel");

  // sandboxUrl for a server started by bash answers from here.
  await bash(client, "mkdir -p site && echo served-ts > site/index.html && cd site && (nohup python3 -m http.server 3000 --bind 0.0.0.0 >/dev/null 2>&1 &)");
  const urlResult = await call(client, "sandboxUrl", { port: 3000 });
  const portUrl = text(urlResult).match(/https?:\/\/[^\s"]+/)?.[0];
  if (urlResult.isError || !portUrl) fail("sandboxUrl gives a URL", urlResult);
  const page = await fetch(portUrl);
  if (!(await page.text()).includes("served-ts")) fail("the URL serves the sandbox's page", portUrl);
  console.log("ok sandboxUrl");
}

await client.close();
console.log("ok done");
