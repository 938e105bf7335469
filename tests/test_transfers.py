"""The ``file`` transfer on real files: staging the same thing twice into one place (two nodes of a job
sharing its directory, or a stage-in done again) gives the same result, never an error; a stopped copy
leaves nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.transfers import Interrupted, Stop
from agent.transfers.file import place

pytestmark = pytest.mark.timeout(30)


def tree(root: Path) -> Path:
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "c.txt").write_text("CD")
    (src / "a.txt").write_text("AB")
    (src / "ln").symlink_to("sub/c.txt")
    return src


@pytest.mark.parametrize("mode", ["copy", "link"])
def test_the_same_directory_staged_twice_into_one_place_is_staged_once_without_error(tmp_path: Path, mode: str) -> None:
    src = tree(tmp_path)
    target = tmp_path / "work" / "tree"
    target.parent.mkdir()
    for _ in range(2):
        place(src, target, mode=mode, stop=Stop())
    assert (target / "a.txt").read_text() == "AB" and (target / "sub" / "c.txt").read_text() == "CD"
    assert (target / "ln").is_symlink() and (target / "ln").read_text() == "CD"
    assert target.is_symlink() is (mode == "link")
    assert sorted(os.listdir(target.parent)) == ["tree"], "a temporary file was left beside the target"


@pytest.mark.parametrize("mode", ["copy", "link"])
def test_a_file_staged_over_a_link_or_a_copy_replaces_it(tmp_path: Path, mode: str) -> None:
    (tmp_path / "one").write_text("1")
    (tmp_path / "two").write_text("2")
    target = tmp_path / "t"
    place(tmp_path / "one", target, mode="link", stop=Stop())
    place(tmp_path / "two", target, mode=mode, stop=Stop())
    assert target.read_text() == "2" and (tmp_path / "one").read_text() == "1"
    assert target.is_symlink() is (mode == "link")


def test_a_stopped_copy_leaves_nothing(tmp_path: Path) -> None:
    src = tree(tmp_path)
    stop = Stop()
    stop.set("canceled")
    with pytest.raises(Interrupted, match="canceled"):
        place(src / "a.txt", tmp_path / "out.txt", mode="copy", stop=stop)
    assert not (tmp_path / "out.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["src"]
