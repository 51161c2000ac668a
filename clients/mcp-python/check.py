"""Drives sandboxd's MCP endpoint with the official Python MCP SDK.

Usage: check.py SCENARIO URL MODE, with the admin token in SANDBOXD_TOKEN.
MODE is `auto` (the SDK picks the newest revision both sides speak) or
`legacy` (the 2025-11-25 `initialize` handshake). Each scenario asserts
what it can see itself and prints `ok: ...` lines; the Rust test
(tests/it/mcp.rs) checks those and what only the host can see, talking to
the interactive scenarios on stdin/stdout. Any failed check exits non-zero.
"""

import asyncio
import json
import os
import re
import sys

import jsonschema
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {
    "bash", "readFile", "writeFile", "editFile", "listFiles", "searchFiles", "sandboxUrl",
    "createCheckpoint", "listCheckpoints", "diffCheckpoint", "restoreCheckpoint",
}


def client(url, mode):
    headers = {"x-sandboxd-admin-token": os.environ.get("SANDBOXD_TOKEN", "")}
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    return Client(transport, mode=mode)


def say(line):
    print(line, flush=True)


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(c, name, args, **kw):
    return await c.call_tool(name, args, **kw)


async def ok_call(c, name, args, **kw):
    r = await call(c, name, args, **kw)
    assert not r.is_error, f"{name} {args}: {text(r)}"
    return r


async def err_call(c, name, args, what):
    r = await call(c, name, args)
    assert r.is_error, f"{name} {args} should be a tool error: {text(r)}"
    say(f"ok: {what}: {text(r)}")
    return r


async def read(c, path):
    return (await ok_call(c, "readFile", {"path": path})).structured_content


async def happy(url, mode):
    async with client(url, mode) as c:
        say(f"protocol: {c.protocol_version}")
        assert c.server_info.name == "sandboxd", c.server_info
        instructions = c.instructions or ""
        assert "/workspace" in instructions and "sandboxUrl" in instructions, instructions
        say("ok: initialize")
        tools = (await c.list_tools()).tools
        assert {t.name for t in tools} == TOOLS, [t.name for t in tools]
        size = 0
        for t in tools:
            jsonschema.Draft202012Validator.check_schema(t.input_schema)
            assert t.input_schema.get("type") == "object", t.input_schema
            size += len(t.description or "")
        say(f"ok: tools listed; descriptions: {size} characters")

        # writeFile, then bash reads it; bash writes, readFile reads it.
        await ok_call(c, "writeFile", {"path": "notes/a.txt", "content": "alpha\nbeta\n"})
        r = await ok_call(c, "bash", {"command": "cat notes/a.txt"})
        assert r.structured_content["stdout"] == "alpha\nbeta\n", r.structured_content
        assert r.structured_content["exitCode"] == 0
        r = await ok_call(c, "bash", {"command": "printf 'one\\ntwo\\nthree\\n' > b.txt", "changes": True})
        assert any(f["path"] == "b.txt" for f in r.structured_content["changes"]["files"]), r.structured_content
        b = await read(c, "b.txt")
        assert b["content"] == "one\ntwo\nthree\n" and b["totalLines"] == 3, b
        part = (await ok_call(c, "readFile", {"path": "b.txt", "startLine": 2, "endLine": 2})).structured_content
        assert part["content"] == "two\n" and part["totalLines"] == 3, part
        say("ok: writeFile->bash and bash->readFile")

        await ok_call(c, "bash", {"command": "head -c 64 /dev/urandom > bin.dat; printf '\\0' >> bin.dat"})
        r = await ok_call(c, "readFile", {"path": "bin.dat"})
        assert r.structured_content["binary"] is True and "binary" in text(r), text(r)
        say("ok: binary named as binary")

        # editFile: one match edits; zero and two matches refuse and change nothing.
        before = await read(c, "notes/a.txt")
        e = await ok_call(c, "editFile", {"path": "notes/a.txt", "oldText": "beta", "newText": "gamma", "ifMatch": before["sha256"]})
        after = await read(c, "notes/a.txt")
        assert after["content"] == "alpha\ngamma\n" and e.structured_content["sha256"] == after["sha256"], (after, e)
        r = await err_call(c, "editFile", {"path": "notes/a.txt", "oldText": "nowhere", "newText": "x"}, "editFile zero matches")
        assert "0 times" in text(r)
        await ok_call(c, "writeFile", {"path": "twice.txt", "content": "x y x\n"})
        r = await err_call(c, "editFile", {"path": "twice.txt", "oldText": "x", "newText": "z"}, "editFile two matches")
        assert "2 times" in text(r)
        assert (await read(c, "twice.txt"))["content"] == "x y x\n"
        assert (await read(c, "notes/a.txt"))["content"] == "alpha\ngamma\n"
        stale = before["sha256"]
        await err_call(c, "writeFile", {"path": "notes/a.txt", "content": "lost", "ifMatch": stale}, "stale writeFile")
        await err_call(c, "editFile", {"path": "notes/a.txt", "oldText": "alpha", "newText": "lost", "ifMatch": stale}, "stale editFile")
        assert (await read(c, "notes/a.txt"))["content"] == "alpha\ngamma\n"
        say("ok: edits all-or-nothing")

        listed = (await ok_call(c, "listFiles", {"depth": 2})).structured_content
        paths = {e["path"] for e in listed["entries"]}
        assert {"notes", "notes/a.txt", "b.txt"} <= paths and listed["total"] == len(listed["entries"]), listed
        found = (await ok_call(c, "searchFiles", {"pattern": "gam+a", "glob": "*.txt"})).structured_content
        assert found["totalMatches"] == 1 and found["matches"][0]["path"].endswith("notes/a.txt"), found
        say("ok: listFiles and searchFiles")

        # 200,000 lines: head and tail within the budget, exact counts.
        r = await ok_call(c, "bash", {"command": "seq 1 200000"})
        shape = r.structured_content["output"]["stdout"]
        shown = [l for l in r.structured_content["stdout"].splitlines() if l.isdigit()]
        assert shape["totalLines"] == 200000, shape
        assert len(shown) + shape["omittedLines"] == 200000, (len(shown), shape)
        assert shown[0] == "1" and shown[-1] == "200000", (shown[:2], shown[-2:])
        assert len(text(r)) < 40000, len(text(r))
        say(f"ok: 200000 lines in {len(text(r))} characters, {shape['omittedLines']} omitted")

        # Progress notifications carry partial output.
        seen = []

        async def progress(p, total, message):
            seen.append(message or "")

        await ok_call(c, "bash", {"command": "for i in $(seq 1 20); do echo tick-$i; sleep 0.1; done"}, progress_callback=progress)
        assert len(seen) >= 2 and any("tick-" in m for m in seen), seen
        say(f"ok: {len(seen)} progress notifications")

        # Bad arguments, a missing file and a path outside are tool errors.
        await err_call(c, "bash", {}, "bash without command")
        await err_call(c, "bash", {"command": "true", "bogus": 1}, "unknown argument")
        await err_call(c, "readFile", {"path": "missing.txt"}, "missing file")
        await err_call(c, "readFile", {"path": "../etc/passwd"}, "path outside the workspace")
        await err_call(c, "sandboxUrl", {"port": 9}, "port not allowed")
    say("done")


async def url(url, mode, port):
    async with client(url, mode) as c:
        await ok_call(c, "bash", {"command": f"nohup python3 -m http.server {port} --bind 0.0.0.0 >/dev/null 2>&1 &"})
        r = await ok_call(c, "sandboxUrl", {"port": int(port)})
        say(f"url: {r.structured_content['url']}")


async def cancel(url, mode):
    async with client(url, mode) as c:
        started = asyncio.Event()

        async def progress(p, total, message):
            if "marker-started" in (message or ""):
                started.set()

        task = asyncio.create_task(c.call_tool(
            "bash", {"command": "echo marker-started; sleep 300 & sleep 300; echo mcp-cancel-marker"},
            progress_callback=progress))
        await asyncio.wait_for(started.wait(), 60)
        say("running")
        await asyncio.to_thread(sys.stdin.readline)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        say("cancelled")
        await asyncio.to_thread(sys.stdin.readline)


def under(entries, prefix):
    return [e["path"] for e in entries if e["path"].startswith(prefix)]


async def checkpoints(url, mode):
    """A turn's files saved, changed, diffed and restored; refusals."""
    async with client(url, mode) as c:
        await ok_call(c, "writeFile", {"path": "turn/a.txt", "content": "turn one\n"})
        made = (await ok_call(c, "createCheckpoint", {"label": "turn-1"})).structured_content
        cp = made["checkpointId"]
        assert made["label"] == "turn-1" and made["files"] >= 1, made
        listed = await ok_call(c, "listCheckpoints", {})
        ids = [x["checkpointId"] for x in listed.structured_content["checkpoints"]]
        assert ids == [cp] and cp in text(listed) and '"turn-1"' in text(listed), text(listed)
        say("ok: createCheckpoint and listCheckpoints")

        await ok_call(c, "writeFile", {"path": "turn/a.txt", "content": "turn two, longer\n"})
        await ok_call(c, "writeFile", {"path": "turn/b.txt", "content": "new\n"})
        r = await ok_call(c, "diffCheckpoint", {"checkpointId": cp})
        d = r.structured_content
        assert under(d["modified"], "turn/") == ["turn/a.txt"], d
        assert under(d["created"], "turn/") == ["turn/b.txt"] and under(d["deleted"], "turn/") == [], d
        assert "modified turn/a.txt (9 → 17 bytes)" in text(r), text(r)
        assert "created turn/b.txt (4 bytes)" in text(r) and f"from {cp} to now" in text(r), text(r)
        named = await ok_call(c, "diffCheckpoint", {"checkpointId": cp, "to": "current"})
        assert named.structured_content == d, "to: current is the files now, as in REST"
        r = await ok_call(c, "diffCheckpoint", {"checkpointId": cp, "text": True})
        assert "--- a/turn/a.txt\n+++ b/turn/a.txt\n@@ -1 +1 @@\n-turn one\n+turn two, longer\n" in text(r), text(r)
        assert "created turn/b.txt (4 bytes)" in text(r), text(r)
        assert r.structured_content["text"]["files"] >= 2, r.structured_content
        say("ok: diffCheckpoint shows the change")

        # A process a command left runs: refused, then ended when asked.
        await ok_call(c, "bash", {"command": "nohup sleep 300 >/dev/null 2>&1 &"})
        r = await err_call(c, "restoreCheckpoint", {"checkpointId": cp}, "restore while a process runs")
        assert r.structured_content["code"] == "commands_running", r.structured_content
        assert (await read(c, "turn/b.txt"))["content"] == "new\n", "nothing restored"
        r = await ok_call(c, "restoreCheckpoint", {"checkpointId": cp, "endCommands": True})
        assert under(r.structured_content["deleted"], "turn/") == ["turn/b.txt"], r.structured_content
        assert (await read(c, "turn/a.txt"))["content"] == "turn one\n"
        await err_call(c, "readFile", {"path": "turn/b.txt"}, "the file made since is gone")
        d = (await ok_call(c, "diffCheckpoint", {"checkpointId": cp})).structured_content
        assert under(d["created"] + d["modified"] + d["deleted"], "turn/") == [], d
        say("ok: restoreCheckpoint brings the file back")

        r = await err_call(c, "diffCheckpoint", {"checkpointId": "cp_unknown"}, "unknown checkpoint")
        assert r.structured_content["code"] == "checkpoint_not_found", r.structured_content
        r = await err_call(c, "createCheckpoint", {"label": "turn-1"}, "label taken")
        assert r.structured_content["code"] == "checkpoint_label_taken", r.structured_content
    say("done")


async def restart(url, mode):
    async with client(url, mode) as c:
        await ok_call(c, "writeFile", {"path": "kept.txt", "content": "kept\n"})
        say("written")
        await asyncio.to_thread(sys.stdin.readline)
        try:
            r = await call(c, "readFile", {"path": "kept.txt"})
            assert not r.is_error, text(r)
            say("continued")
        except Exception as e:  # the spec's 404: initialize again
            say(f"told to re-initialise: {e}")
            async with client(url, mode) as again:
                r = await ok_call(again, "readFile", {"path": "kept.txt"})
            say("re-initialised")
        assert r.structured_content["content"] == "kept\n", r.structured_content
        say("ok: file kept")


def main():
    scenario, url_, mode = sys.argv[1:4]
    mode = "legacy" if mode == "legacy" else "auto"
    runs = {
        "happy": lambda: happy(url_, mode),
        "url": lambda: url(url_, mode, sys.argv[4]),
        "cancel": lambda: cancel(url_, mode),
        "restart": lambda: restart(url_, mode),
        "checkpoints": lambda: checkpoints(url_, mode),
    }
    asyncio.run(runs[scenario]())


if __name__ == "__main__":
    main()
