"""The E2B section's client (bench/sections/e2b.rs): E2B's Python SDK
(`e2b`, pinned in clients/e2b-python/requirements.txt), unchanged, with
E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set to sandboxd, against
sandboxd's own REST, timed by this one process's clock in the same way,
alternating which goes first. Before each new-sandbox sample the pool is
waited for until it holds 2 ready members again, so each create is a
claim. Prints one JSON object of samples (ms) on its last line."""

import json
import os
import sys
import time

import httpx
from e2b import Sandbox

BASE = os.environ["E2B_API_URL"]
REST = httpx.Client(base_url=BASE, timeout=60)
CREATES, CREATE_WARMUPS = int(sys.argv[1]), 2
RUNS, RUN_WARMUPS = int(sys.argv[2]), 3


def pool_ready(n=2, limit=120):
    """Polls /metrics until the default runtime's pool has `n` ready."""
    deadline = time.monotonic() + limit
    while True:
        text = REST.get("/metrics").text
        ready = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("sandboxd_pool_members{")
            and 'runtime="default"' in line
            and 'state="ready"' in line
        )
        if ready >= n:
            return
        assert time.monotonic() < deadline, f"the pool did not reach {n} in {limit} s"
        time.sleep(0.01)


def ms(t):
    return (time.perf_counter() - t) * 1000


def sdk_create_run(_):
    t = time.perf_counter()
    sbx = Sandbox.create()
    r = sbx.commands.run("true")
    took = ms(t)
    assert r.exit_code == 0, r
    sbx.kill()
    return took


def rest_create_run(i):
    t = time.perf_counter()
    made = REST.post("/v1/sandboxes", json={"sessionKey": f"bench-e2b-rest-{i}"})
    sid = made.json()["sandboxId"]
    r = REST.post(f"/v1/sandboxes/{sid}/commands:run", json={"command": "true"})
    took = ms(t)
    assert made.status_code == 200 and r.json()["exitCode"] == 0, (made.text, r.text)
    REST.post(f"/v1/sandboxes/{sid}:stop")
    return took


def alternate(n, warmups, sdk, rest, before=lambda: None):
    """`n` samples of each after `warmups`, alternating which goes first."""
    out = {"sdk": [], "rest": []}
    for i in range(warmups + n):
        order = [("sdk", sdk), ("rest", rest)] if i % 2 == 0 else [("rest", rest), ("sdk", sdk)]
        for name, fn in order:
            before()
            took = fn(i)
            if i >= warmups:
                out[name].append(took)
    return out


def main():
    creates = alternate(CREATES, CREATE_WARMUPS, sdk_create_run, rest_create_run, pool_ready)
    pool_ready()
    sbx = Sandbox.create()
    sid = sbx.sandbox_id

    def sdk_run(_):
        t = time.perf_counter()
        r = sbx.commands.run("true")
        took = ms(t)
        assert r.exit_code == 0, r
        return took

    def rest_run(_):
        t = time.perf_counter()
        r = REST.post(f"/v1/sandboxes/{sid}/commands:run", json={"command": "true"})
        took = ms(t)
        assert r.json()["exitCode"] == 0, r.text
        return took

    runs = alternate(RUNS, RUN_WARMUPS, sdk_run, rest_run)
    sbx.kill()
    print(json.dumps({"creates": creates, "runs": runs}), flush=True)


main()
