"""Paths beneath a sandbox's directory: links that stay inside work as the sandbox's commands see
them; whatever leads out, or is no regular file, is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from trajkit.sandbox import FileTooLarge, NotARegularFile, OutsideSandbox
from trajkit.sandbox.confined import Beneath


@pytest.fixture
def tree(tmp_path: Path) -> Beneath:
    root = tmp_path / "fs"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "sub" / "deep" / "file.txt").write_text("inside\n")
    os.symlink("sub/deep", root / "rel_dir")  # relative, inside
    os.symlink("/work/sub/deep/file.txt", root / "abs_file")  # absolute in the sandbox's view
    os.symlink("../file.txt", root / "sub" / "deep" / "up")  # climbs, but stays inside
    os.symlink("/work/rel_dir", root / "chain")  # a link to a link
    os.symlink("loop_b", root / "loop_a")
    os.symlink("loop_a", root / "loop_b")
    (tmp_path / "outside.txt").write_text("host\n")
    os.symlink(str(tmp_path / "outside.txt"), root / "host_link")
    return Beneath(str(root), "/work")


@pytest.mark.parametrize(
    "path", ["sub/deep/file.txt", "/work/sub/deep/file.txt", "rel_dir/file.txt", "abs_file", "chain/file.txt"]
)
def test_links_inside_are_followed_as_the_sandbox_sees_them(tree: Beneath, path: str) -> None:
    assert tree.read(path, 1024) == b"inside\n"


def test_writes_follow_inside_links_and_create_parents(tree: Beneath) -> None:
    tree.write("abs_file", b"changed\n")
    assert tree.read("sub/deep/file.txt", 100) == b"changed\n"
    tree.write("rel_dir/new/dir/x.txt", b"x")
    assert (Path(tree.root) / "sub/deep/new/dir/x.txt").read_bytes() == b"x"


def test_a_link_that_climbs_inside_resolves_from_its_own_directory(tree: Beneath) -> None:
    (Path(tree.root) / "sub" / "file.txt").write_text("one up\n")
    assert tree.read("rel_dir/up", 100) == b"one up\n"


@pytest.mark.parametrize("path", ["host_link", "../outside.txt", "/etc/hostname", "/work/../outside.txt"])
def test_what_leads_out_is_refused(tree: Beneath, path: str) -> None:
    with pytest.raises(OutsideSandbox):
        tree.read(path, 100)
    with pytest.raises(OutsideSandbox):
        tree.write(path, b"pwned")
    assert (Path(tree.root).parent / "outside.txt").read_text() == "host\n"


def test_loops_fifos_and_limits(tree: Beneath) -> None:
    with pytest.raises(OSError) as loop:
        tree.read("loop_a", 100)
    assert loop.value.errno == errno.ELOOP
    os.mkfifo(Path(tree.root) / "fifo")
    with pytest.raises(NotARegularFile):
        tree.read("fifo", 100)
    with pytest.raises(NotARegularFile):
        tree.write("fifo", b"x")
    tree.write("big", b"0123456789" * 10)
    with pytest.raises(FileTooLarge) as big:
        tree.read("big", 10)
    assert (big.value.size, big.value.head, big.value.tail) == (100, b"01234", b"56789")
