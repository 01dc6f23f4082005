"""The ``huggingface_hub`` calls, and their errors turned into one-line ``WeightsError``s.

Everything the user sets is read by ``huggingface_hub`` itself, at call time: ``HF_ENDPOINT``,
``HF_HOME`` / ``HF_HUB_CACHE`` (the cache), ``HF_TOKEN`` (gated and private repos),
``HF_HUB_OFFLINE`` (cache only). A transfer cut off mid-file resumes with a ``Range`` request
(``huggingface_hub`` retries); a file already in the cache is never fetched again.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, NoReturn

from httpx2 import HTTPError  # huggingface_hub's HTTP client: its transport errors, after its retries
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import DryRunFileInfo
from tqdm.std import tqdm

from rtserve.weights.errors import WeightsError
from rtserve.weights.progress import DownloadProgress


def cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    return constants.is_offline_mode()


def _token_state() -> str:
    return (
        "HF_TOKEN is set" if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") else "no HF_TOKEN"
    )


def bar_class(progress: DownloadProgress) -> type[tqdm]:
    """A ``tqdm_class`` for ``huggingface_hub``: draws nothing, adds each update to ``progress``."""

    class _Bar(tqdm):  # type: ignore[misc]  # tqdm ships no type information
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True  # no terminal bar: the progress lines in the log replace it
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            progress.advance(int(n or 0))
            return None

    return _Bar


def plan(repo_id: str, revision: str | None, filename: str) -> DryRunFileInfo | None:
    """Size and cache state of one file; None when the repo has no such file (or, offline,
    the cache holds no copy of it). Raises ``WeightsError`` for every other failure."""
    try:
        return hf_hub_download(repo_id, filename, revision=revision, dry_run=True)
    except RemoteEntryNotFoundError:
        return None
    except LocalEntryNotFoundError:
        if offline():
            return None
        _fail(repo_id, revision, filename, None)
    except (OSError, HTTPError, ValueError) as exc:
        _fail(repo_id, revision, filename, exc)


def download(repo_id: str, revision: str | None, filename: str, progress: DownloadProgress) -> Path:
    """The file's path in the snapshot folder (a symlink into ``blobs/``), downloaded if needed."""
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, tqdm_class=bar_class(progress)))
    except (OSError, HTTPError, ValueError) as exc:
        _fail(repo_id, revision, filename, exc)


def list_files(repo_id: str, revision: str | None) -> list[str]:
    """Every file name in the repo; offline, those of its snapshot in the cache (none cached: [])."""
    try:
        if offline():
            folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
            return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
        return HfApi().list_repo_files(repo_id, revision=revision)  # HF_ENDPOINT as set now
    except LocalEntryNotFoundError:
        return []
    except (OSError, HTTPError, ValueError) as exc:
        _fail(repo_id, revision, "its file list", exc)


def not_found(repo_id: str, revision: str | None, filename: str) -> WeightsError:
    where = _label(repo_id, revision)
    if offline():
        return WeightsError(
            f"{where}: {filename} is not in the hub cache {cache_dir()} and HF_HUB_OFFLINE is set; "
            f"run 'rtserve download {repo_id}' where the hub is reachable, or unset HF_HUB_OFFLINE"
        )
    return WeightsError(f"{where} has no file {filename!r}, which the engine needs")


def _label(repo_id: str, revision: str | None) -> str:
    return f"hf://{repo_id}" + (f"@{revision}" if revision else "")


def _fail(repo_id: str, revision: str | None, filename: str, exc: BaseException | None) -> NoReturn:
    where = _label(repo_id, revision)
    endpoint = constants.ENDPOINT
    if isinstance(exc, GatedRepoError):
        raise WeightsError(
            f"{where} is gated ({_token_state()}): accept its terms on {endpoint}/{repo_id} with the account "
            "whose token HF_TOKEN holds"
        ) from None
    if isinstance(exc, RepositoryNotFoundError):
        raise WeightsError(
            f"{where}: no such repo at {endpoint}, or it is private or gated and needs HF_TOKEN ({_token_state()})"
        ) from None
    if isinstance(exc, RevisionNotFoundError):
        raise WeightsError(f"{where}: revision {revision or 'main'!r} not found") from None
    if isinstance(exc, RemoteEntryNotFoundError):
        raise not_found(repo_id, revision, filename) from None
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code in (401, 403):
        raise WeightsError(
            f"{where}: the hub refused {filename} ({exc.response.status_code}, {_token_state()}): set HF_TOKEN to a "
            f"token of an account that accepted the repo's gate on {endpoint}/{repo_id}"
        ) from None
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        raise WeightsError(f"{where}: the hub answered {exc.response.status_code} for {filename}") from None
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise WeightsError(
            f"{where}: disk full while downloading {filename} into the hub cache {cache_dir()}; "
            "free space there or point HF_HUB_CACHE elsewhere"
        ) from None
    if exc is None or isinstance(exc, LocalEntryNotFoundError | HTTPError):
        if offline():
            raise not_found(repo_id, revision, filename) from None
        raise WeightsError(
            f"{where}: cannot reach {endpoint} for {filename} and the hub cache {cache_dir()} has no copy "
            "(check the network, HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only the cache)"
        ) from None
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
    raise WeightsError(f"{where}: cannot fetch {filename}: {detail}") from None
