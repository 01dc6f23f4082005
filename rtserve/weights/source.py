"""What a weight setting names, and how an engine gets the files it reads from there.

Forms (docs/engines.md#hub-weights):

* a local folder (``~`` expanded): used as it is, nothing downloaded;
* ``hf://ORG/NAME[@REVISION]``: a hub repo, at a branch, tag or commit (default ``main``);
* ``ORG/NAME[@REVISION]``: the same, when no local folder of that name exists.

A file name an engine reads may itself be ``hf://ORG/NAME[@REVISION]/PATH``: a file of another
repo (Kyutai configs point at shared Mimi weights that way), fetched the same way; without a
revision it is that repo's ``main``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rtserve.weights import hub
from rtserve.weights.errors import WeightsError
from rtserve.weights.progress import BOARD, DownloadBoard, DownloadProgress

_REPO = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[^/@\s]+))?$")
_FILE_REF = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[^/@\s]+))?/(?P<path>.+)$")


@dataclass(frozen=True)
class HubRepo:
    repo_id: str
    revision: str | None = None  # None: main

    def __str__(self) -> str:
        return f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def parse_weights(value: str, field: str) -> Path | HubRepo:
    """A local folder or a hub repo, as the setting ``field`` names it."""
    if value.startswith("hf://"):
        match = _REPO.match(value.removeprefix("hf://"))
        if match is None:
            raise WeightsError(f"invalid config field {field!r}: {value!r} is not hf://ORG/NAME[@REVISION]")
        return HubRepo(match["repo"], match["rev"])
    folder = Path(value).expanduser()
    match = _REPO.match(value)
    if match is not None and not folder.exists():
        return HubRepo(match["repo"], match["rev"])
    return folder


def safe_name(name: str, where: str) -> str:
    """A relative file name that stays inside its folder, judged by the name itself: a hub
    snapshot's files are symlinks into ``blobs/``, so resolving them would always 'leave' it."""
    parts = PurePosixPath(name).parts
    if not name or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
        raise WeightsError(f"{where}: file name {name!r} leaves the weight folder (a relative path is required)")
    return name


class WeightSource:
    """The files of one weight setting. ``fetch`` takes every name an engine needs at once, so
    the download's total is known (and every missing or refused file reported) before the
    first byte of the large ones."""

    def __init__(
        self, root: Path | HubRepo, field: str, *, progress_interval_s: float, board: DownloadBoard | None = BOARD
    ) -> None:
        self.root = root
        self.field = field
        self._interval_s = progress_interval_s
        self._board = board
        self._local_root = root if isinstance(root, Path) else None

    @property
    def local_root(self) -> Path | None:
        """The folder, or the repo's snapshot folder in the hub cache once a file of it was fetched."""
        return self._local_root

    def _found(self, root: HubRepo | Path, path: str, local: Path) -> Path:
        if root == self.root and self._local_root is None:
            self._local_root = local.parents[len(PurePosixPath(path).parts) - 1]
        return local

    @property
    def label(self) -> str:
        return str(self.root)

    @property
    def folder(self) -> Path | None:
        """The local folder, or None for a hub repo."""
        return self.root if isinstance(self.root, Path) else None

    def fetch(self, names: Mapping[str, str], *, optional: Collection[str] = ()) -> dict[str, Path | None]:
        """Local paths of ``names`` (file name -> who needs it, for messages); None for an
        absent name listed in ``optional``."""
        where = f"{self.label} ({self.field})"
        wanted: dict[str, tuple[HubRepo | Path, str]] = {}
        for name in names:
            ref = _FILE_REF.match(name)
            if ref is not None:
                wanted[name] = (HubRepo(ref["repo"], ref["rev"]), safe_name(ref["path"], where))
            elif name.startswith(("hf://", "http://", "https://")):
                raise WeightsError(f"{where}: {name!r} is not a file name nor hf://ORG/NAME[@REVISION]/PATH")
            else:
                wanted[name] = (self.root, safe_name(name, where))
        found: dict[str, Path | None] = {}
        pending: list[tuple[str, HubRepo, str]] = []
        total = 0
        for name, (root, path) in wanted.items():
            if isinstance(root, Path):
                if not root.is_dir():
                    raise WeightsError(f"invalid config field {self.field!r}: weight folder {root} does not exist")
                local = root / path
                found[name] = local if local.is_file() else None
                continue
            info = hub.plan(root.repo_id, root.revision, path)
            if info is None:
                found[name] = None
            elif info.is_cached:
                found[name] = self._found(root, path, Path(info.local_path))
            else:
                pending.append((name, root, path))
                total += info.file_size or 0
        for name, value in found.items():
            if value is None and name not in optional:
                root, path = wanted[name]
                if isinstance(root, HubRepo):
                    raise WeightsError(f"{hub.not_found(root.repo_id, root.revision, path)} ({names[name]})")
                raise WeightsError(f"missing file {root / path} ({names[name]})")
        if pending:
            progress = DownloadProgress(self.label, interval_s=self._interval_s, board=self._board)
            progress.begin(total)
            try:
                for name, root, path in pending:
                    found[name] = self._found(root, path, hub.download(root.repo_id, root.revision, path, progress))
            finally:
                progress.finish()
        return found

    def file(self, name: str, needed_by: str) -> Path:
        """One file that must exist."""
        path = self.fetch({name: needed_by})[name]
        assert path is not None  # fetch raises for a required name it cannot find
        return path


def open_source(value: str, field: str, *, progress_interval_s: float) -> WeightSource:
    return WeightSource(parse_weights(value, field), field, progress_interval_s=progress_interval_s)
