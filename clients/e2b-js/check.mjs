// E2B's own JavaScript SDK (`e2b`, pinned in package.json), unchanged,
// against a real sandboxd with E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL set to it. Each check prints `ok <name> <json>` when it
// passes; the first that fails throws, and the run exits 1.
// tests/it/e2b_js.rs runs it and asserts every name printed, in order.
import http from "node:http";
import { AuthenticationError, CommandExitError, NotFoundError, Sandbox } from "e2b";

const HOME = "/home/user";

function ok(name, fields = {}) {
  console.log(`ok ${name} ${JSON.stringify(fields)}`);
}

function check(cond, why, detail) {
  if (!cond) throw new Error(`${why}: ${JSON.stringify(detail)}`);
}

async function raised(fn) {
  try {
    await fn();
  } catch (e) {
    return e;
  }
  throw new Error("no error was thrown");
}

async function until(what, cond) {
  const deadline = Date.now() + 30_000;
  while (!(await cond())) {
    check(Date.now() < deadline, `timed out waiting for ${what}`, null);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const sbx = await Sandbox.create();
ok("create", { sandbox: sbx.sandboxId });

const chunks = [];
const r = await sbx.commands.run("echo hi; echo oops >&2", { onStdout: (d) => chunks.push(d) });
check(r.exitCode === 0 && r.stdout === "hi\n" && r.stderr === "oops\n", "run", r);
check(chunks.join("") === "hi\n", "onStdout", chunks);
const env = await sbx.commands.run('echo "$FOO" && touch here', { envs: { FOO: "foo" }, cwd: `${HOME}/sub` });
check(env.stdout === "foo\n", "envs", env.stdout);
check((await sbx.files.exists(`${HOME}/sub/here`)) === true, "cwd", null);
const failed = await raised(() => sbx.commands.run("exit 4"));
check(failed instanceof CommandExitError && failed.exitCode === 4, "exit 4", String(failed));
ok("commands");

const bg = await sbx.commands.run("sleep 300", { background: true });
check((await sbx.commands.list()).some((p) => p.pid === bg.pid), "listed", bg.pid);
check((await sbx.commands.kill(bg.pid)) === true, "kill", bg.pid);
await until("the killed command to leave the list", async () =>
  !(await sbx.commands.list()).some((p) => p.pid === bg.pid),
);
ok("background", { pid: bg.pid });

await sbx.files.write(`${HOME}/js.txt`, "from js");
check((await sbx.files.read(`${HOME}/js.txt`)) === "from js", "read", null);
const names = (await sbx.files.list(HOME)).map((e) => e.name);
check(names.includes("js.txt"), "list", names);
check((await sbx.files.exists(`${HOME}/js.txt`)) === true, "exists", null);
check((await sbx.files.exists(`${HOME}/nope`)) === false, "not exists", null);
const info = await sbx.files.getInfo(`${HOME}/js.txt`);
check(info.name === "js.txt" && info.size === 7, "getInfo", info);
const missing = await raised(() => sbx.files.read(`${HOME}/missing.txt`));
check(missing instanceof NotFoundError, "missing file", String(missing));
await sbx.files.remove(`${HOME}/js.txt`);
check((await sbx.files.exists(`${HOME}/js.txt`)) === false, "removed", null);
ok("files");

let screen = "";
const decoder = new TextDecoder();
const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (screen += decoder.decode(d)) });
await sbx.pty.sendInput(term.pid, new TextEncoder().encode("echo $((6*7))\n"));
await until("42 on the terminal", () => screen.includes("42"));
await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
await sbx.pty.sendInput(term.pid, new TextEncoder().encode("stty size\n"));
await until("the new size", () => screen.includes("30 100"));
check((await sbx.pty.kill(term.pid)) === true, "pty kill", term.pid);
ok("pty");

const cat = await sbx.commands.run("cat", { background: true, stdin: true });
await sbx.commands.sendStdin(cat.pid, "to cat\n");
await sbx.commands.closeStdin(cat.pid);
const catDone = await cat.wait();
check(catDone.stdout === "to cat\n", "stdin", catDone.stdout);
ok("stdin", { pid: cat.pid });

check((await sbx.files.makeDir(`${HOME}/jsdir`)) === true, "makeDir", null);
check((await sbx.files.makeDir(`${HOME}/jsdir`)) === false, "makeDir again", null);
const events = [];
const watcher = await sbx.files.watchDir(`${HOME}/jsdir`, (e) => events.push(e), { recursive: true });
await sbx.files.write(`${HOME}/jsdir/a.txt`, "a");
const moved = await sbx.files.rename(`${HOME}/jsdir/a.txt`, `${HOME}/jsdir/b.txt`);
check(moved.path === `${HOME}/jsdir/b.txt`, "rename", moved);
await until("the watch's events", () =>
  ["a.txt", "b.txt"].every((n) => events.some((e) => e.name === n)),
);
await watcher.stop();
check(events.every((e) => ["a.txt", "b.txt"].includes(e.name)), "only the user's names", events);
ok("dirs_watch", { events: events.length });

const sleeper = await sbx.commands.run("sleep 600", { background: true });
check((await sbx.pause()) === true, "pause", null);
check((await sbx.getInfo()).state === "paused", "paused state", null);
const resumed = await Sandbox.connect(sbx.sandboxId);
check((await resumed.commands.list()).some((p) => p.pid === sleeper.pid), "still running", sleeper.pid);
ok("pause");

// getHost(port): sandboxd forwards a request with that name as Host to
// the port (sent to sandboxd's own address: the name is not in any DNS).
const api = new URL(process.env.E2B_SANDBOX_URL);
const host = sbx.getHost(8000);
check(host === `8000-${sbx.sandboxId}.${api.host}`, "getHost", host);
await sbx.files.write(`${HOME}/site/index.html`, "served to js");
await sbx.commands.run(`cd ${HOME}/site && exec python3 -m http.server 8000 --bind 127.0.0.1`, { background: true });
const getByHost = () =>
  new Promise((resolve) => {
    const req = http.get({ host: api.hostname, port: api.port, path: "/", headers: { host } }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    });
    req.on("error", (e) => resolve({ status: 0, body: String(e) }));
  });
let page;
await until("the port to answer by its host", async () => (page = await getByHost()).status === 200);
check(page.body === "served to js", "served by name", page);
// downloadUrl: signed, opened with no headers.
const url = await sbx.downloadUrl(`${HOME}/site/index.html`);
const got = await fetch(url);
check(got.status === 200 && (await got.text()) === "served to js", "downloadUrl", url);
ok("host", { host });

const details = await sbx.getInfo();
check(details.sandboxId === sbx.sandboxId && details.templateId === "base", "getInfo", details);
const listed = [];
const pages = Sandbox.list();
while (pages.hasNext) listed.push(...(await pages.nextItems()));
check(listed.some((s) => s.sandboxId === sbx.sandboxId), "Sandbox.list", listed);
ok("info");

const short = await Sandbox.create({ timeoutMs: 300_000 });
await short.commands.run("sleep 600", { background: true });
await short.setTimeout(2_000);
const left = ((await short.getInfo()).endAt.getTime() - Date.now()) / 1000;
check(left > 0 && left <= 2.5, "setTimeout moved the end time", left);
await until("the shortened sandbox to end though a command runs", async () => !(await short.isRunning()));
ok("timeout", { sandbox: short.sandboxId });

const wrongKey = await raised(() => Sandbox.create({ apiKey: "e2b_" + "0".repeat(40) }));
check(wrongKey instanceof AuthenticationError, "wrong API key", String(wrongKey));
ok("errors");

await sbx.kill();
check((await Sandbox.kill(sbx.sandboxId)) === false, "a second kill finds nothing", null);
ok("kill");
console.log("done");
