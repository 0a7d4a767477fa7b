"""``patch`` in its unified-diff mode and ``search_files``, as a model uses them and as a hostile one
tries to: diffs made by real diff programs, paths and globs that aim out of the sandbox."""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.test_file_tools import with_tools
from trajkit.plugins.files import tools as file_tools
from trajkit.tools import ToolContext, ToolError

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 41))


def edited(text: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[4] = "line five, edited\n"
    lines.insert(20, "a new line after 20\n")
    del lines[35]
    return "".join(lines)


async def patch_mode(diff: str, ctx: ToolContext) -> dict[str, Any]:
    return dict(json.loads(await file_tools.patch({"mode": "patch", "patch": diff}, ctx)))


def test_diffs_from_real_diff_programs_apply(tmp_path: Path) -> None:
    """``diff -u`` and ``git diff`` output (a new file, a last line without its newline) and
    difflib's, with line numbers the model got wrong by a few."""
    work = tmp_path / "repo"
    (work / "src").mkdir(parents=True)
    (work / "src" / "app.py").write_text(ORIGINAL)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "core.hooksPath=/dev/null"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "original"]):
        subprocess.run([*git, *command], cwd=work, check=True, capture_output=True)
    (work / "src" / "app.py").write_text(edited(ORIGINAL))
    (work / "src" / "new.txt").write_text("fresh\nno newline at the end")
    subprocess.run([*git, "add", "-N", "src/new.txt"], cwd=work, check=True)
    git_diff = subprocess.run([*git, "diff", "--no-color"], cwd=work, capture_output=True, text=True).stdout
    assert "new file mode" in git_diff and "\\ No newline at end of file" in git_diff
    (work / "a" / "src").mkdir(parents=True)
    (work / "b" / "src").mkdir(parents=True)
    (work / "a" / "src" / "app.py").write_text(ORIGINAL)
    (work / "b" / "src" / "app.py").write_text(edited(ORIGINAL))
    plain = subprocess.run(
        ["diff", "-u", "a/src/app.py", "b/src/app.py"], cwd=work, capture_output=True, text=True
    )
    shifted = "".join(difflib.unified_diff(ORIGINAL.splitlines(True), edited(ORIGINAL).splitlines(True),
                                           "a/app.py", "b/app.py")).replace("@@ -2,7", "@@ -5,7")  # fmt: skip

    async def body(ctx: ToolContext) -> list[Any]:
        await ctx.sandbox.write_file("src/app.py", ORIGINAL.encode())
        first = await patch_mode(git_diff, ctx)
        after_git = [await ctx.sandbox.read_file("src/app.py"), await ctx.sandbox.read_file("src/new.txt")]
        await ctx.sandbox.write_file("src/app.py", ORIGINAL.encode())
        await patch_mode(plain.stdout, ctx)
        after_plain = await ctx.sandbox.read_file("src/app.py")
        await ctx.sandbox.write_file("app.py", ORIGINAL.encode())
        await patch_mode(shifted, ctx)
        return [first, *after_git, after_plain, await ctx.sandbox.read_file("app.py")]

    first, app, new, plain_app, shifted_app = with_tools(tmp_path / "sandboxes", body)
    assert first == {"files_modified": ["src/app.py"], "files_created": ["src/new.txt"], "hunks_applied": 4}
    assert app.decode() == plain_app.decode() == shifted_app.decode() == edited(ORIGINAL)
    assert new == b"fresh\nno newline at the end"


def test_a_diff_that_does_not_apply_writes_nothing_and_says_where(tmp_path: Path) -> None:
    good = "--- a/one.txt\n+++ b/one.txt\n@@ -1,2 +1,2 @@\n-alpha\n+ALPHA\n beta\n"
    bad = "--- a/two.txt\n+++ b/two.txt\n@@ -2,2 +2,2 @@\n gamma\n-delta\n+DELTA\n"

    async def body(ctx: ToolContext) -> tuple[str, bytes, str, str]:
        await ctx.sandbox.write_file("one.txt", b"alpha\nbeta\n")
        await ctx.sandbox.write_file("two.txt", b"first\ngamma\nepsilon\n")
        with pytest.raises(ToolError) as refused:
            await patch_mode(good + bad, ctx)
        with pytest.raises(ToolError) as garbage:
            await patch_mode("please change alpha to ALPHA", ctx)
        with pytest.raises(ToolError) as broken:
            await patch_mode("--- a/one.txt\n+++ b/one.txt\n@@ -1,5 +1,5 @@\n-alpha\n+ALPHA\n", ctx)
        return (
            str(refused.value),
            await ctx.sandbox.read_file("one.txt"),
            str(garbage.value),
            str(broken.value),
        )

    refused, one, garbage, broken = with_tools(tmp_path, body)
    assert refused == (
        "two.txt: hunk 1 (at line 2) does not apply: line 3 is 'epsilon', the hunk expects 'delta' "
        "(and its lines are nowhere else after the previous hunk); nothing was written"
    )
    assert one == b"alpha\nbeta\n"
    assert garbage.startswith("the patch holds no file changes: expected a unified diff")
    assert broken == "the patch is not a valid unified diff: Hunk is shorter than expected"


HOSTILE_DIFFS = {
    "climbs out": (
        "--- a/../../outside.txt\n+++ b/../../outside.txt\n@@ -1 +1 @@\n-x\n+y\n",
        "outside the sandbox",
    ),
    "an absolute host path": (
        "--- /etc/hostname\n+++ /etc/hostname\n@@ -1 +1 @@\n-x\n+y\n",
        "outside the sandbox",
    ),
    "creates through a symlink out": (
        "--- /dev/null\n+++ b/escape/planted.txt\n@@ -0,0 +1 @@\n+planted\n",
        "outside the sandbox",
    ),
    "edits through a symlink": (
        "--- a/hostname\n+++ b/hostname\n@@ -1 +1 @@\n-x\n+y\n",
        "outside the sandbox",
    ),
    "a FIFO": (
        "--- a/pipe\n+++ b/pipe\n@@ -1 +1 @@\n-x\n+y\n",
        "not a regular file (a device, FIFO or socket)",
    ),
    "a git symlink": (
        "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/passwd\n"
        "\\ No newline at end of file\n",
        "l: the patch tool does not apply a symbolic link",
    ),
    "a deletion": (
        "--- a/notes.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-keep me\n",
        "notes.txt: the patch tool does not apply a deletion: delete files with the terminal",
    ),
    "a rename": (
        "diff --git a/notes.txt b/moved.txt\nsimilarity index 100%\nrename from notes.txt\nrename to moved.txt\n",
        "moved.txt: the patch tool does not apply a rename: rename files with the terminal",
    ),
    "creates over a file": (
        "--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+replaced\n",
        "cannot create notes.txt: it exists already",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_DIFFS))
def test_hostile_diffs_are_refused_without_host_paths(tmp_path: Path, case: str) -> None:
    diff, reason = HOSTILE_DIFFS[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hostname").write_text("x\n")

    async def body(ctx: ToolContext) -> str:
        await ctx.sandbox.write_file("notes.txt", b"keep me\n")
        setup = f"mkfifo pipe && ln -s {outside} escape && ln -s {outside}/hostname hostname"
        assert (await ctx.sandbox.exec(setup, timeout=30)).exit_code == 0
        with pytest.raises(ToolError) as refused:
            await patch_mode(diff, ctx)
        assert await ctx.sandbox.read_file("notes.txt") == b"keep me\n"
        return str(refused.value)

    message = with_tools(tmp_path / "sandboxes", body)
    assert reason in message and str(tmp_path) not in message
    assert sorted(os.listdir(outside)) == ["hostname"] and (outside / "hostname").read_text() == "x\n"


# -- search_files --------------------------------------------------------------------------------

TREE = {
    "src/app.py": "import os\n\ndef main():\n    print('hello')\n    return 0\n",
    "src/util.py": "def helper():\n    return 'hello again'\n",
    "docs/guide.md": "# Guide\nSay hello to the app.\n",
    "src/deep/more.py": "".join(f"value_{i} = {i}\n" for i in range(30)),
}


async def planted(ctx: ToolContext) -> None:
    for path, text in TREE.items():
        await ctx.sandbox.write_file(path, text.encode())


async def search(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    return dict(json.loads(await file_tools.search_files(args, ctx)))


def test_search_contents_files_and_counts(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> list[dict[str, Any]]:
        await planted(ctx)
        return [
            await search(ctx, pattern="hel+o"),
            await search(ctx, pattern="hello", file_glob="*.py", context=1),
            await search(ctx, pattern="value_[0-9]+ = [12][0-9]$", path="src/deep", limit=5, offset=3),
            await search(ctx, pattern="hello", output_mode="files_only"),
            await search(ctx, pattern="^(def|import) ", output_mode="count", path="/work/src"),
            await search(ctx, pattern="*.py", target="files"),
            await search(ctx, pattern="more.py", target="files", path="src/deep/more.py"),
        ]

    plain, globbed, paged, files_only, counts, by_name, one_file = with_tools(tmp_path, body)
    assert plain == {"total_count": 3, "matches": [
        {"path": "docs/guide.md", "line": 2, "content": "Say hello to the app."},
        {"path": "src/app.py", "line": 4, "content": "    print('hello')"},
        {"path": "src/util.py", "line": 2, "content": "    return 'hello again'"},
    ]}  # fmt: skip
    assert globbed["matches"][0] == {
        "path": "src/app.py", "line": 4, "content": "    print('hello')",
        "before": ["def main():"], "after": ["    return 0"],
    }  # fmt: skip
    assert [m["line"] for m in paged["matches"]] == [14, 15, 16, 17, 18]
    assert (paged["total_count"], paged["next_offset"]) == (20, 8)
    assert files_only == {"total_count": 3, "files": ["docs/guide.md", "src/app.py", "src/util.py"]}
    assert counts == {
        "total_count": 2,
        "total_matches": 3,
        "counts": {"/work/src/app.py": 2, "/work/src/util.py": 1},
    }
    assert by_name["files"] == ["src/app.py", "src/deep/more.py", "src/util.py"]
    assert one_file["files"] == ["src/deep/more.py"]


def test_search_results_fit_the_output_cap_and_page_on(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> list[dict[str, Any]]:
        await ctx.sandbox.write_file("wide.txt", ("match " + "w" * 900 + "\n").encode() * 40)
        return [await search(ctx, pattern="match", limit=1000)]

    [first] = with_tools(tmp_path, body)
    assert first["total_count"] == 40 and 0 < len(first["matches"]) == first["next_offset"] < 40
    assert len(json.dumps(first).encode()) <= 4096
    assert all(len(m["content"]) == 500 for m in first["matches"])


HOSTILE_SEARCHES: dict[str, tuple[dict[str, Any], str | None]] = {
    "path climbs out": ({"pattern": "root", "path": "../../../../etc"}, "outside the sandbox"),
    "absolute host path": ({"pattern": "root", "path": "/etc"}, "outside the sandbox"),
    "path through a symlink out": ({"pattern": "secret", "path": "escape"}, "outside the sandbox"),
    "path is a FIFO": ({"pattern": "x", "path": "pipe"}, "not a regular file (a device, FIFO or socket)"),
    "path is an option": ({"pattern": "x", "path": "-delete"}, "no such file"),
    "glob climbs": ({"pattern": "secret", "file_glob": "../*"}, None),
    "glob runs a command": ({"pattern": "x", "file_glob": "$(touch pwned)*"}, None),
    "glob is an action": ({"pattern": "x", "target": "files", "path": ".", "file_glob": "-delete"}, None),
    "pattern quotes out": ({"pattern": "x' ; touch pwned ; '", "file_glob": "*`touch pwned`"}, None),
    "pattern is an option": ({"pattern": "--include=/etc/*"}, None),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SEARCHES))
def test_hostile_searches_stay_in_the_sandbox(tmp_path: Path, case: str) -> None:
    """Refused with the file tools' reasons, or run as a search of the sandbox's own regular files:
    no command runs, nothing outside is read, a link or FIFO inside the tree is never opened."""
    args, reason = HOSTILE_SEARCHES[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret root x\n")

    async def body(ctx: ToolContext) -> tuple[str, list[str]]:
        await planted(ctx)
        setup = f"mkfifo pipe && ln -s {outside} escape && ln -s {outside}/secret.txt src/linked.txt"
        assert (await ctx.sandbox.exec(setup, timeout=30)).exit_code == 0
        if reason is not None:
            with pytest.raises(ToolError) as refused:
                await file_tools.search_files(args, ctx)
            said = str(refused.value)
        else:
            said = await file_tools.search_files(args, ctx)
        listing = await ctx.sandbox.exec("find . | sort", timeout=30)
        return said, listing.stdout.split()

    said, files = with_tools(tmp_path / "sandboxes", body)
    if reason is not None:
        assert said.endswith(reason), said
    assert "secret" not in said and str(tmp_path) not in said
    assert "./pwned" not in files and "./src/app.py" in files and "./pipe" in files
    assert (outside / "secret.txt").read_text() == "secret root x\n"


def test_a_huge_sparse_file_in_the_tree_is_not_read_through(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> dict[str, Any]:
        await planted(ctx)
        assert (await ctx.sandbox.exec("truncate -s 3G src/sparse.bin", timeout=30)).exit_code == 0
        return await search(ctx, pattern="hello", path="src")

    assert with_tools(tmp_path, body)["total_count"] == 2


@pytest.mark.engine("docker")
@pytest.mark.parametrize("image", ["trajkit-test/busybox:latest", "trajkit-test/python:latest"])
def test_search_and_patch_in_containers_with_busybox_or_gnu_tools(image: str) -> None:
    """BusyBox's grep has no -Z, -I or -D: the search falls back to a file at a time, same results."""
    from tests.test_docker_backend import UNAVAILABLE
    from trajkit.sandbox import SandboxSpec
    from trajkit.testing.engines import need_engine

    need_engine("docker", UNAVAILABLE)
    from trajkit_docker import DockerBackend

    async def main() -> list[Any]:
        backend = DockerBackend({})
        sandbox = await backend.create(SandboxSpec(run_id=f"search-{os.getpid()}", work_id="w0", image=image))
        try:
            ctx = ToolContext(sandbox, timeout=60, output_cap=4096)
            await planted(ctx)
            assert (
                await sandbox.exec("mkfifo src/pipe && ln -s /etc/passwd src/passwd", timeout=30)
            ).exit_code == 0
            diff = "--- a/src/util.py\n+++ b/src/util.py\n@@ -1,2 +1,2 @@\n def helper():\n-    return 'hello again'\n+    return 'bye'\n"
            return [
                await search(ctx, pattern="hel+o", context=1),
                await search(ctx, pattern="*.py", target="files", path="/work/src"),
                await search(ctx, pattern="root", path="src"),
                await patch_mode(diff, ctx),
                await search(ctx, pattern="hello", output_mode="count"),
            ]
        finally:
            await sandbox.close()
            await backend.aclose()

    found, names, linked, patched, counts = asyncio.run(main())
    assert [(m["path"], m["line"]) for m in found["matches"]] == [
        ("docs/guide.md", 2), ("src/app.py", 4), ("src/util.py", 2)
    ]  # fmt: skip
    assert found["matches"][1]["before"] == ["def main():"] and found["matches"][1]["after"] == [
        "    return 0"
    ]
    assert names["files"] == ["/work/src/app.py", "/work/src/deep/more.py", "/work/src/util.py"]
    assert linked["total_count"] == 0  # the link to /etc/passwd is not followed, the FIFO not opened
    assert patched["files_modified"] == ["src/util.py"]
    assert counts["counts"] == {"docs/guide.md": 1, "src/app.py": 1}


def test_the_documented_schemas_are_the_tools_schemas() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "tools.md").read_text()
    generated = page[page.index("## Schemas\n") :].split("\n\n", 2)[2]
    assert generated == file_tools.schemas_markdown(), (
        "stale: regenerate docs/tools.md's last section from trajkit.plugins.files.tools.schemas_markdown()"
    )
