"""The training-step intake's Unix datagram socket: created owner-and-group only, in a directory
others cannot write to, atomically renamed into place; a stale socket left by a dead agent is taken
over, a live one (a second agent) refused. Every refusal says what to change."""

from __future__ import annotations

import contextlib
import grp
import os
import socket
import stat
from pathlib import Path

SOCKET_MODE = 0o660            # owner and group only


class IntakeError(RuntimeError):
    """The intake socket cannot be opened; the message says why and what to do."""


def open_socket(path: Path, group: str | None) -> tuple[socket.socket, int]:
    """Bind a non-blocking datagram socket at `path`, mode 0660 (and `group`) from the first moment.

    It is bound under a temporary name, given its mode and group, then renamed into place, so no
    client ever sees it with looser permissions. A stale socket is replaced; a live one (another
    agent) or a file that is not a socket is left alone and reported.
    """
    gid = _group_id(group) if group is not None else -1
    directory = path.parent
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise IntakeError(f"{directory} is not a directory; set train.socket to a path in a directory") from None
    except OSError as error:
        raise IntakeError(f"cannot create {directory} for the training-step socket ({error.strerror}); "
                          "run the agent as root or set train.socket to a writable path") from None
    info = directory.stat()
    shared = info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX
    if info.st_uid not in (0, os.geteuid()) or shared:
        raise IntakeError(f"{directory} is writable by others or owned by another user; refusing to put "
                          "the training-step socket there (set train.socket to a private directory)")
    _clear_stale(path)
    temporary = directory / f".{path.name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(temporary))
        os.chmod(temporary, SOCKET_MODE)
        if gid >= 0:
            os.chown(temporary, -1, gid)
        os.rename(temporary, path)
        sock.setblocking(False)
    except OSError as error:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise IntakeError(f"cannot open the training-step socket {path} ({error.strerror}); check the "
                          "directory's permissions and train.socket_group") from None
    return sock, path.stat().st_ino


def _clear_stale(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise IntakeError(f"{path} exists and is not a socket; remove it or set train.socket elsewhere")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink()             # left behind by an agent that died: take it over
        return
    except OSError as error:
        raise IntakeError(f"cannot check the existing socket {path} ({error.strerror})") from None
    finally:
        probe.close()
    raise IntakeError(f"another process is already reading {path} (a second agent?); stop it or set "
                      "train.socket to another path")


def _group_id(group: str) -> int:
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise IntakeError(f"train.socket_group {group!r} is not a group on this host; create it or "
                          "give an existing group name or id") from None
