"""Weight settings parsed as users write them; archives unpacked safely and bounded;
progress lines at a bounded rate."""

from __future__ import annotations

import io
import logging
import tarfile
from pathlib import Path

import pytest

from rtserve.weights import WeightsError
from rtserve.weights.archive import unpack_once
from rtserve.weights.progress import DownloadBoard, DownloadProgress, DownloadStatus
from rtserve.weights.source import HubRepo, parse_weights, safe_name


def test_weight_settings_name_a_folder_or_a_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_weights("hf://kyutai/moshiko-pytorch-bf16", "w") == HubRepo("kyutai/moshiko-pytorch-bf16")
    assert parse_weights("hf://nvidia/personaplex-7b-v1@v1.0", "w") == HubRepo("nvidia/personaplex-7b-v1", "v1.0")
    assert parse_weights("kyutai/moshiko-pytorch-bf16", "w") == HubRepo("kyutai/moshiko-pytorch-bf16")
    (tmp_path / "kyutai" / "moshiko-pytorch-bf16").mkdir(parents=True)  # a local folder of that name wins
    assert parse_weights("kyutai/moshiko-pytorch-bf16", "w") == Path("kyutai/moshiko-pytorch-bf16")
    assert parse_weights(str(tmp_path), "w") == tmp_path
    with pytest.raises(WeightsError, match="is not hf://ORG/NAME"):
        parse_weights("hf://just-a-name", "w")


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", ""])
def test_names_leaving_the_folder_are_refused_by_name(name: str) -> None:
    with pytest.raises(WeightsError, match="leaves the weight folder"):
        safe_name(name, "w")


def _tar(path: Path, members: list[tarfile.TarInfo], body: bytes = b"") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(body) if member.isfile() else None)
    return path


def _file(name: str, size: int = 4) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.size = size
    return member


def test_an_archive_unpacks_once_into_its_target(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "voices.tgz", [_file("voices/A.pt"), _file("voices/B.pt")], b"data")
    target = unpack_once(archive, tmp_path / "voices", max_bytes=100, max_members=10)
    assert sorted(p.name for p in target.iterdir()) == ["A.pt", "B.pt"]
    (target / "A.pt").write_bytes(b"kept")
    assert unpack_once(archive, tmp_path / "voices", max_bytes=100, max_members=10) == target
    assert (target / "A.pt").read_bytes() == b"kept"  # not unpacked again
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_hostile_or_oversized_archives_are_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo("voices/evil.pt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    cases = [
        ([_file("../escape.pt")], "leaves the folder"),
        ([_file("/abs.pt")], "leaves the folder"),
        ([link], "not a plain file"),
        ([_file("voices/big.pt", 4)] * 3, "more than 2 members"),
    ]
    for index, (members, message) in enumerate(cases):
        archive = _tar(tmp_path / f"a{index}.tgz", members, b"data")
        with pytest.raises(WeightsError, match=message):
            unpack_once(archive, tmp_path / f"t{index}", max_bytes=100, max_members=2)
        assert not (tmp_path / f"t{index}").exists()
    archive = _tar(tmp_path / "big.tgz", [_file("voices/a.pt", 8)], b"12345678")
    with pytest.raises(WeightsError, match=r"weights\.max_archive_bytes"):
        unpack_once(archive, tmp_path / "big", max_bytes=7, max_members=10)


def test_progress_lines_at_a_bounded_rate_and_the_board_sums(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    board = DownloadBoard()
    heard: list[DownloadStatus | None] = []
    unsubscribe = board.subscribe(lambda: heard.append(board.status()))
    progress = DownloadProgress("hf://o/n", interval_s=1.0, board=board, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="rtserve.weights.progress"):
        progress.begin(4 * 2**20)
        for _ in range(8):  # 8 updates over 0.8 s: one line at most
            now[0] += 0.1
            progress.advance(2**18)
        now[0] += 0.5
        progress.advance(2**20)  # 1.3 s: a line
        assert board.status() == DownloadStatus(3 * 2**20, 4 * 2**20)
        progress.finish()
    lines = [r.getMessage() for r in caplog.records if "%" in r.getMessage()]
    assert len(lines) == 1 and "3.0 MiB of 4.0 MiB (75.0%)" in lines[0] and "/s, ETA" in lines[0]
    # Listeners heard the start, the one progress line and the end (the engine set re-announces each).
    assert heard == [DownloadStatus(0, 4 * 2**20), DownloadStatus(3 * 2**20, 4 * 2**20), None]
    unsubscribe()
