# sandboxd file helper: runs inside the sandbox, as the sandbox user, as
#   python3 -I -S -c 'import os; exec(os.environ["SANDBOXD_FILE_HELPER"])' WORKSPACE
# and serves requests on stdin until it closes, so the kernel enforces the
# read-only root, the user's rights and no-follow opens for us, and a file
# operation costs one round trip instead of a process start. Every path is walked from the workspace one component at a
# time, relative to directory fds, with O_NOFOLLOW: a symlink is followed
# only by hand, only when its target stays in the workspace, and a directory
# swapped for a symlink mid-walk makes the next open fail instead of leaving.
#
# Protocol, per request: a JSON header line {"op": ..., "size": N, ...}
# followed by N payload bytes; the answer is a JSON status line
# {"ok": true, "size": M} or {"ok": false, "code": ..., "message": ...,
# "size": 0} followed by M body bytes.
#   read   {path, max}            body: the content
#   list   {path}                 body: {"entries": [...]}
#   write  {files: [{path, mode, size}]}, payload: the contents back to back
#   delete {paths, recursive}
import errno, json, os, resource, secrets, stat, sys

WS = sys.argv[1]
# Every spelling of the workspace (the same volume mounted again): an
# absolute symlink target under any of them stays inside.
SPELLINGS = [[c for c in d.split("/") if c] for d in sys.argv[1:]]
MAX_HOPS = 40
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Fail(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def parts_of(rel):
    return [c for c in rel.split("/") if c and c != "."]


def under_workspace(target, path):
    """The components of absolute `target` below the workspace, or an
    escape when it lies under no spelling of it."""
    clean = [c for c in target.split("/") if c and c != "."]
    for ws in SPELLINGS:
        if clean[: len(ws)] == ws:
            return clean[len(ws):]
    raise escape(path)


def escape(path):
    return Fail("symlink_escape", "%s leads outside the workspace through a symlink" % path)


def walk_dirs(parts, path, create=False, created=None):
    """Opens the directory `parts` names, following in-workspace symlinks.
    Returns (fd, resolved components)."""
    fds = [os.open(WS, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    stack = []
    todo = list(parts)
    hops = 0
    try:
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if not stack:
                    raise escape(path)
                stack.pop()
                os.close(fds.pop())
                continue
            cur = fds[-1]
            try:
                st = os.stat(name, dir_fd=cur, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise Fail("not_found", "%s does not exist" % path)
                os.mkdir(name, 0o755, dir_fd=cur)
                if created is not None:
                    created.append("/".join(stack + [name]))
                st = os.stat(name, dir_fd=cur, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_HOPS:
                    raise Fail("symlink_loop", "%s has too many levels of symlinks" % path)
                target = os.readlink(name, dir_fd=cur)
                tparts = target.split("/")
                if target.startswith("/"):
                    rest = under_workspace(target, path)
                    while len(fds) > 1:
                        os.close(fds.pop())
                    stack = []
                    todo = rest + todo
                else:
                    todo = tparts + todo
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise Fail("not_a_directory", "%s: %s is not a directory" % (path, "/".join(stack + [name])))
            try:
                fds.append(os.open(name, DIR_FLAGS, dir_fd=cur))
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Fail("changed", "%s changed while it was being opened" % path)
                raise
            stack.append(name)
        fd = fds.pop()
        return fd, stack
    finally:
        for f in fds:
            os.close(f)


def locate(rel, follow_last=True, create=False, created=None):
    """The directory fd holding the target of `rel`, and the target's name
    in it (None when `rel` names a directory through '.' or '..', or is the
    workspace itself). With follow_last, a final symlink is followed (only
    inside the workspace)."""
    parts = parts_of(rel)
    hops = 0
    while True:
        if not parts or parts[-1] == "..":
            fd, _ = walk_dirs(parts, rel, create, created)
            return fd, None
        fd, stack = walk_dirs(parts[:-1], rel, create, created)
        leaf = parts[-1]
        if not follow_last:
            return fd, leaf
        try:
            st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return fd, leaf
        if not stat.S_ISLNK(st.st_mode):
            return fd, leaf
        hops += 1
        if hops > MAX_HOPS:
            os.close(fd)
            raise Fail("symlink_loop", "%s has too many levels of symlinks" % rel)
        target = os.readlink(leaf, dir_fd=fd)
        os.close(fd)
        if target.startswith("/"):
            parts = under_workspace(target, rel)
        else:
            # Relative to the link's directory; walk_dirs resolves '..'
            # against real directories and refuses to climb above the root.
            parts = stack + [c for c in target.split("/") if c != "."]


def op_read(req, payload):
    limit, rel = int(req["max"]), req["path"]
    dfd, leaf = locate(rel)
    try:
        if leaf is None:
            raise Fail("is_directory", "%s is a directory" % rel)
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            raise Fail("not_found", "%s does not exist" % rel)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Fail("changed", "%s changed while it was being opened" % rel)
            if e.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
                raise Fail("not_regular", "%s is not a regular file" % rel)
            raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Fail("is_directory", "%s is a directory" % rel)
        if not stat.S_ISREG(st.st_mode):
            raise Fail("not_regular", "%s is not a regular file" % rel)
        if st.st_size > limit:
            raise Fail("too_large", "%s is %d bytes, more than the %d allowed" % (rel, st.st_size, limit))
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, max(1 << 20, st.st_size + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise Fail("too_large", "%s grew past the %d bytes allowed" % (rel, limit))
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def kind(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def op_list(req, payload):
    rel = req["path"]
    dfd, leaf = locate(rel)
    if leaf is not None:
        try:
            st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(dfd)
            raise Fail("not_found", "%s does not exist" % rel)
        if not stat.S_ISDIR(st.st_mode):
            os.close(dfd)
            raise Fail("not_a_directory", "%s is not a directory" % rel)
        try:
            fd = os.open(leaf, DIR_FLAGS, dir_fd=dfd)
        except OSError:
            raise Fail("changed", "%s changed while it was being opened" % rel)
        finally:
            os.close(dfd)
    else:
        fd = dfd
    entries = []
    try:
        for name in sorted(os.listdir(fd)):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            entries.append({
                # Names are bytes; ones that are not UTF-8 are shown lossily.
                "name": os.fsencode(name).decode("utf-8", "replace"),
                "type": kind(st.st_mode),
                "size": st.st_size,
                "mtimeMs": st.st_mtime_ns // 1000000,
                "mode": stat.S_IMODE(st.st_mode),
            })
    finally:
        os.close(fd)
    return json.dumps({"entries": entries}).encode()


def op_write(req, payload):
    header = req
    created = []
    staged = []  # (dir fd, temp name, final name)
    targets = []  # (dir fd, final name, file header)
    try:
        for f in header["files"]:
            dfd, leaf = locate(f["path"], create=True, created=created)
            if leaf is None:
                os.close(dfd)
                raise Fail("is_directory", "%s is a directory" % f["path"])
            try:
                st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    os.close(dfd)
                    raise Fail("is_directory", "%s is a directory" % f["path"])
            except FileNotFoundError:
                pass
            targets.append((dfd, leaf, f))
        view_all = memoryview(payload)
        offset = 0
        for dfd, leaf, f in targets:
            tmp = ".sandboxd-%s" % secrets.token_hex(8)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            staged.append((dfd, tmp, leaf))
            try:
                os.fchmod(fd, f["mode"])
                size = f["size"]
                if offset + size > len(view_all):
                    raise Fail("io", "the content of %s ended early" % f["path"])
                view = view_all[offset:offset + size]
                offset += size
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
        for dfd, tmp, leaf in staged:
            os.rename(tmp, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
        staged = []
        return b""
    except BaseException:
        for dfd, tmp, _ in staged:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        for d in reversed(created):
            try:
                rmdir_under(d)
            except (OSError, Fail):
                pass
        raise
    finally:
        for dfd, _, _ in targets:
            try:
                os.close(dfd)
            except OSError:
                pass


def rmdir_under(rel):
    parts = parts_of(rel)
    fd, _ = walk_dirs(parts[:-1], rel)
    try:
        os.rmdir(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def remove_tree(dfd, name):
    fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
    try:
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                remove_tree(fd, entry)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def op_delete(req, payload):
    header = req
    recursive = bool(header.get("recursive"))
    for rel in header["paths"]:
        try:
            dfd, leaf = locate(rel, follow_last=False)
        except Fail as e:
            if e.code == "not_found":
                continue
            raise
        try:
            if leaf is None:
                raise Fail("invalid", "%s names a directory through '..' or '.'; name it directly" % rel)
            try:
                st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if not recursive:
                    raise Fail("needs_recursive", "%s is a directory; delete it with recursive: true" % rel)
                remove_tree(dfd, leaf)
            else:
                os.unlink(leaf, dir_fd=dfd)
        finally:
            os.close(dfd)


OPS = {"read": op_read, "list": op_list, "write": op_write, "delete": op_delete}


def answer(req, payload):
    try:
        return {"ok": True}, OPS[req["op"]](req, payload) or b""
    except Fail as e:
        return {"ok": False, "code": e.code, "message": e.message}, b""
    except OSError as e:
        if e.errno == errno.EFBIG:
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            message = ("the file would exceed the sandbox's file size limit of %d bytes" % limit
                       if limit != resource.RLIM_INFINITY else "the file is too large for its filesystem")
            return {"ok": False, "code": "too_large", "message": message}, b""
        code = {errno.ENOSPC: "no_space", errno.EDQUOT: "no_space", errno.EACCES: "permission_denied",
                errno.EPERM: "permission_denied", errno.EROFS: "permission_denied",
                errno.ENAMETOOLONG: "invalid", errno.EISDIR: "is_directory",
                errno.ENXIO: "not_regular",
                # Met only when the sandbox changes a path while we walk it.
                errno.ELOOP: "changed", errno.ENOTDIR: "changed", errno.ENOENT: "changed",
                errno.EEXIST: "changed", errno.ENOTEMPTY: "changed"}.get(e.errno, "io")
        return {"ok": False, "code": code, "message": os.strerror(e.errno or 0)}, b""
    except Exception as e:  # a bug here must still answer in our format
        return {"ok": False, "code": "io", "message": "file helper failed: %r" % (e,)}, b""


def serve():
    src, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = src.readline()
        if not line:
            return
        req = json.loads(line)
        size = int(req.get("size", 0))
        payload = src.read(size) if size else b""
        if len(payload) < size:
            return
        status, body = answer(req, payload)
        status["size"] = len(body)
        out.write(json.dumps(status).encode() + b"\n")
        out.write(body)
        out.flush()


serve()
