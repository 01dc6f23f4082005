"""Unpack an archive a repo ships (PersonaPlex's ``voices.tgz``) once, beside it, safely.

Only regular files and folders are taken; a member whose name is absolute, climbs out with
``..``, or is a link, device or fifo is refused. The unpacked size and member count are
bounded (``weights.max_archive_bytes`` / ``weights.max_archive_members``), checked from the
headers before anything is written. It unpacks into a temporary folder that is renamed into
place, so an interrupted unpack is never taken for a finished one.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from rtserve.weights.errors import WeightsError
from rtserve.weights.progress import human_bytes

log = logging.getLogger(__name__)


def unpack_once(archive: Path, target: Path, *, max_bytes: int, max_members: int) -> Path:
    """``target`` holding the archive's files (the archive's one top folder, if it has one,
    becomes ``target``). Does nothing when ``target`` exists already."""
    if target.is_dir():
        return target
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = _checked(tar, archive, max_bytes=max_bytes, max_members=max_members)
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
            try:
                tar.extractall(staging, members=members, filter="data")
                tops = list(staging.iterdir())
                unpacked = tops[0] if len(tops) == 1 and tops[0].is_dir() else staging
                os.replace(unpacked, target)
            except OSError as exc:
                if target.is_dir():  # another process unpacked it meanwhile
                    return target
                raise WeightsError(f"cannot unpack {archive.name} into {target.parent}: {exc.strerror}") from None
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except (tarfile.TarError, EOFError) as exc:
        raise WeightsError(f"{archive.name} is not a readable tar archive: {exc}") from None
    log.info("unpacked %s into %s", archive.name, target)
    return target


def _checked(tar: tarfile.TarFile, archive: Path, *, max_bytes: int, max_members: int) -> list[tarfile.TarInfo]:
    members: list[tarfile.TarInfo] = []
    size = 0
    for member in tar:
        if len(members) >= max_members:
            raise WeightsError(f"{archive.name} has more than {max_members} members (weights.max_archive_members)")
        parts = PurePosixPath(member.name).parts
        if PurePosixPath(member.name).is_absolute() or ".." in parts:
            raise WeightsError(f"{archive.name}: member {member.name!r} leaves the folder it unpacks into")
        if not (member.isfile() or member.isdir()):
            raise WeightsError(f"{archive.name}: member {member.name!r} is not a plain file or folder")
        size += member.size
        if size > max_bytes:
            raise WeightsError(
                f"{archive.name} unpacks to more than {human_bytes(max_bytes)} (weights.max_archive_bytes)"
            )
        members.append(member)
    return members
