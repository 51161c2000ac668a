"""Stand-ins for the world outside, run by the egress tests inside a network
namespace of their own (see harness/fakenet.rs), so no test traffic leaves
this machine:

- a "public" web server on 203.0.113.10 (port 80 and an unusual 8022);
- a "private" one on 10.250.77.10 (the same ports);
- a name server on 203.0.113.53 that answers the test's names.

Each web server counts the requests it gets (GET /hits answers the count of
the others, and is not counted). /redirect-private redirects to the private
server; /big?mb=N sends N MiB. The public one is also a package index for
one package, `sbtpkg`: PyPI's simple API under /simple/ and npm's registry
under /npm/.
"""

import base64
import hashlib
import io
import json
import socket
import socketserver
import struct
import tarfile
import zipfile
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PUBLIC = "203.0.113.10"
PRIVATE = "10.250.77.10"
DNS = "203.0.113.53"

HITS = {PUBLIC: 0, PRIVATE: 0}
LOCK = threading.Lock()
REBIND = [0]

NAMES = {
    "public.test": [PUBLIC],
    "private.test": [PRIVATE],
    "mixed.test": [PUBLIC, PRIVATE],
    "allowed.test": [PUBLIC],
    "sub.allowed.test": [PUBLIC],
    "privately.allowed.test": [PRIVATE],
}


def wheel():
    """sbtpkg 1.0 as a wheel."""
    files = {
        "sbtpkg/__init__.py": b"VALUE = 'installed'\n",
        "sbtpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sbtpkg\nVersion: 1.0\n",
        "sbtpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fakenet\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "sbtpkg-1.0.dist-info/RECORD,,\n"
    files["sbtpkg-1.0.dist-info/RECORD"] = record.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def npm_tarball():
    """sbtpkg 1.0.0 as npm packs it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for name, data in {
            "package/package.json": b'{"name": "sbtpkg", "version": "1.0.0", "main": "index.js"}',
            "package/index.js": b"module.exports = 'installed';\n",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


WHEEL = wheel()
TGZ = npm_tarball()
WHEEL_NAME = "sbtpkg-1.0-py3-none-any.whl"
SIMPLE = (
    f'<html><body><a href="/files/{WHEEL_NAME}#sha256={hashlib.sha256(WHEEL).hexdigest()}">{WHEEL_NAME}</a></body></html>'
).encode()
PACKUMENT = json.dumps(
    {
        "name": "sbtpkg",
        "dist-tags": {"latest": "1.0.0"},
        "versions": {
            "1.0.0": {
                "name": "sbtpkg",
                "version": "1.0.0",
                "main": "index.js",
                "dist": {
                    "tarball": "http://public.test/npm/sbtpkg/-/sbtpkg-1.0.0.tgz",
                    "integrity": "sha512-" + base64.b64encode(hashlib.sha512(TGZ).digest()).decode(),
                },
            }
        },
    }
).encode()
PACKAGES = {
    "/simple/sbtpkg/": ("text/html", SIMPLE),
    f"/files/{WHEEL_NAME}": ("application/octet-stream", WHEEL),
    "/npm/sbtpkg": ("application/json", PACKUMENT),
    "/npm/sbtpkg/-/sbtpkg-1.0.0.tgz": ("application/octet-stream", TGZ),
}


class Server(ThreadingHTTPServer):
    def server_bind(self):
        # HTTPServer's own looks up the address's name: a DNS query, which
        # must not leave this machine.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        here = self.server.server_address[0]
        if self.path == "/hits":
            with LOCK:
                n = HITS[here]
            return self.reply(200, f"{n}\n".encode())
        with LOCK:
            HITS[here] += 1
        if here == PUBLIC and self.path in PACKAGES:
            kind, body = PACKAGES[self.path]
            return self.reply(200, body, [("Content-Type", kind)])
        if self.path == "/redirect-private":
            return self.reply(302, b"", [("Location", f"http://{PRIVATE}/")])
        if self.path.startswith("/big"):
            mb = int(self.path.split("mb=", 1)[1]) if "mb=" in self.path else 1
            self.send_response(200)
            self.send_header("Content-Length", str(mb << 20))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            for _ in range(mb):
                self.wfile.write(chunk)
            return
        name = "public" if here == PUBLIC else "private"
        self.reply(200, f"{name}\n".encode())


def answer(query):
    """A DNS answer to `query` (one question), or None to stay silent."""
    if len(query) < 12:
        return None
    (qid,) = struct.unpack("!H", query[:2])
    labels, i = [], 12
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype, _ = struct.unpack("!HH", query[i + 1 : i + 5])
    question = query[12 : i + 5]
    name = ".".join(labels).lower()
    if name == "rebind.test":
        # Public, then private, then public... (counted by A queries): a
        # name whose answer changes between a check and a connect.
        if qtype == 1:
            REBIND[0] += 1
        addrs = [PUBLIC if REBIND[0] % 2 else PRIVATE]
    elif name == "v6private.test":
        addrs = ["fd00::10"]
    else:
        addrs = NAMES.get(name)
    if addrs is None:
        return struct.pack("!HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question
    records = b""
    count = 0
    for a in addrs:
        v6 = ":" in a
        if (qtype == 28) != v6:
            continue
        data = socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, a)
        # Name by pointer to the question; TTL 0 so nothing is cached.
        records += struct.pack("!HHHIH", 0xC00C, qtype, 1, 0, len(data)) + data
        count += 1
    return struct.pack("!HHHHHH", qid, 0x8180, 1, count, 0, 0) + question + records


def serve_dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((DNS, 53))
    while True:
        query, peer = s.recvfrom(512)
        try:
            reply = answer(query)
        except Exception:  # a malformed query gets no answer
            reply = None
        if reply:
            s.sendto(reply, peer)


def main():
    servers = [Server((a, p), Handler) for a in (PUBLIC, PRIVATE) for p in (80, 8022)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    threading.Thread(target=serve_dns, daemon=True).start()
    print("fakenet ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or dies)


if __name__ == "__main__":
    main()
