"""Where a build writes: a hidden temporary sibling, installed by one rename.

- **Nothing half-written.** Everything is written into
  ``.<name>.tmp-<pid>-<host>-<hex>`` next to the output directory; it is
  renamed to its final name only when complete. ``overwrite`` moves the old
  index aside (``.<name>.old-<pid>-<host>-<hex>``), renames the new one in,
  then deletes the old one.
- **Nothing left behind.** A temporary directory's name records its owner
  (process id, and ``<host>``, a hash of the host name), so the record exists
  from the instant ``mkdir`` returns and survives a half-finished removal. A
  build that is killed cannot remove its own; the next build into the same
  place removes every one whose process is gone (on this host), and those of
  older builds, which recorded their owner in an ``.owner`` file.
- **Failures are messages.** ``os_failure`` turns the OS errors a build can hit
  (permissions, a full disk, a read-only filesystem) into a ``BuildError`` that
  names the path and the fix.

This module must not import torch.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path

from lookupdec.errors import IndexFormatError, LookupdecError
from lookupdec.index.manifest import MANIFEST_NAME

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]  # names carry it: no dashes, fixed length


class BuildError(LookupdecError, OSError):
    """A build could not write its output (permissions, disk space, memory); the message names the fix."""


def prepare_out(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """The absolute output path, checked: its parent exists, and it is new or (with ``overwrite``) an index.

    Raises:
        IndexFormatError: as the checks say.
    """
    out = Path(out_dir).expanduser().absolute()
    if not out.parent.is_dir():
        why = "is a file, not a directory" if out.parent.exists() else "does not exist"
        raise IndexFormatError(f"cannot create {out}: its parent {out.parent} {why}; choose an output path "
                               "inside an existing directory")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise IndexFormatError(f"{out} already exists; choose another output directory or pass overwrite=True "
                                   "(--overwrite)")
        if not looks_like_index(out):
            raise IndexFormatError(
                f"{out} exists and is not a lookupdec index (or an empty directory); refusing to replace it "
                "even with overwrite, so nothing else is deleted: remove it yourself or choose another directory"
            )
    return out


def looks_like_index(path: Path) -> bool:
    """True for an empty directory or one holding only index files (safe to replace)."""
    if path.is_symlink() or not path.is_dir():
        return False
    names = [p.name for p in path.iterdir()]
    return all(n == MANIFEST_NAME or n.startswith("shard-") or n.startswith("manifest-") for n in names)


def make_temp(out: Path) -> Path:
    """A fresh temporary sibling of ``out`` owned by this process (stale ones removed first).

    Raises:
        BuildError: the parent directory cannot be written.
    """
    remove_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{_owner_tag()}{secrets.token_hex(4)}"
    try:
        os.mkdir(tmp)  # unlike mkdtemp's 0700: the usual permissions, which the index keeps
    except OSError as exc:
        raise os_failure(exc, out) from None
    return tmp


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary and swap directories next to ``out`` whose owning process is gone.

    Returns:
        The directories removed.
    """
    removed = []
    try:
        names = [d.name for d in out.parent.iterdir()]  # not glob: the name may hold [, * or ?
    except OSError:
        return removed
    for prefix in (f".{out.name}.tmp-", f".{out.name}.old-"):
        for name in (n for n in names if n.startswith(prefix)):
            pid, host, *_ = name[len(prefix):].split("-") + ["", ""]
            if host != HOST or not pid.isdigit():
                pid = _older_owner(out.parent / name)
                if pid is None:
                    continue  # another host's, or not a build's: not ours to judge
            if not _alive(int(pid)):
                shutil.rmtree(out.parent / name, ignore_errors=True)
                removed.append(out.parent / name)
    return removed


def _older_owner(d: Path) -> str | None:
    """The process id in the ``.owner`` file that builds before the owner moved into the name wrote
    (``{"host": ..., "pid": ...}``), when it names this host; else None."""
    try:
        owner = json.loads((d / ".owner").read_text())
        return str(int(owner["pid"])) if owner["host"] == socket.gethostname() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def install(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``out``; with ``overwrite``, swap out an existing index."""
    if out.exists():
        if not overwrite or not looks_like_index(out):  # re-checked: it may have appeared meanwhile
            raise IndexFormatError(f"{out} appeared during the build; nothing was replaced (pass overwrite=True to "
                                   "replace it)")
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{_owner_tag()}", dir=out.parent))
        os.rename(out, old / "index")
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old / "index", out)  # put the old index back
            shutil.rmtree(old, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_dir(out.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is still atomic
    finally:
        os.close(fd)


def os_failure(exc: OSError, out: Path) -> BuildError:
    """The BuildError for an OS error met while building ``out``: what happened and what to do."""
    where = getattr(exc, "filename", None) or out
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return BuildError(f"the disk is full while writing {where}: free space on that disk or write the index "
                          "elsewhere (-o DIR); the partial build was removed")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return BuildError(f"cannot write {where}: {exc.strerror}; pass an output directory (-o) in a writable place")
    return BuildError(f"cannot write {where}: {exc.strerror or exc}; check the output directory (-o)")


def memory_failure(shard_tokens: int) -> BuildError:
    return BuildError(f"out of memory while building a shard of up to {shard_tokens:,} tokens (about "
                      f"{shard_tokens * 13 // 2**20:,} MiB needed); lower --shard-tokens (or --max-memory)")


def _owner_tag() -> str:
    """``<pid>-<host>-``: the owner, as the start of a temporary directory's random suffix."""
    return f"{os.getpid()}-{HOST}-"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
