"""Who runs what in a sandbox's container, and the working directory handed to the commands' user.

Every container is made with no capability (``cap_drop ALL``) and ``no-new-privileges``, so no
process in it holds a privilege or can gain one (a setuid binary, file capabilities), whoever it runs
as. On top of that, by default (``docker.user=auto``):

- commands run as the image's own user when the image names one other than root, else as
  :data:`~trajkit_docker.settings.DEFAULT_USER` (1000:1000): a uid that most images do not use
  for anything of their own (or use for their one ordinary user);
- the container's first process, which only waits for the sandbox's lifetime and reaps orphans,
  runs as :data:`~trajkit_docker.settings.KEEPER_USER` (65534, "nobody"): a user of its own, so
  commands can neither signal it, trace it, nor read its environment;
- the working directory, and whatever the image put in it, is handed to the commands' user
  (the engine's archive API rewrites the owners: a capability-less root inside could not; once per
  image and directory, see :mod:`trajkit_docker.workdirs`), so a project the image ships there can
  be edited; the file tools write as that user too, so they
  cannot change what the user could not (the image's programs and libraries, which a check runs);
- ``HOME`` is ``/tmp`` when the user's own home is missing or not writable (a uid without an entry
  in the image's ``/etc/passwd`` gets ``/`` from the engine).

``docker.user=image`` runs everything as the image's own user (root for most images, still without
capabilities); ``docker.user=USER[:GROUP]`` names one.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from trajkit.sandbox import ImageUnavailable
from trajkit_docker.archive import ChunkReader
from trajkit_docker.settings import DEFAULT_USER, KEEPER_USER

FALLBACK_HOME = "/tmp"


@dataclass(frozen=True)
class SandboxUser:
    """The user a sandbox's commands and files belong to."""

    name: str | None
    """As the engine takes it (``exec --user``); None for the container's own (``user=image``)."""
    uid: int
    gid: int
    home: str | None
    """``HOME`` to give commands, when the user's own will not do; None to keep it."""

    @property
    def root(self) -> bool:
        return self.uid == 0


def commands_user(setting: str, image_user: str) -> str | None:
    """Who commands run as, per ``docker.user`` and the user the image names (``""``: none)."""
    if setting == "image":
        return None
    if setting != "auto":
        return setting
    return image_user if image_user and not names_root(image_user) else DEFAULT_USER


def keeper_user(setting: str) -> str | None:
    """Who the container's first process runs as; None keeps the image's user."""
    return None if setting == "image" else KEEPER_USER


def names_root(user: str) -> bool:
    return user.split(":", 1)[0] in ("root", "0")


def probed_user(name: str | None, image: str, output: str) -> SandboxUser:
    """The user from ``scripts/probe.sh``'s output; ImageUnavailable when the image lacks a needed tool or
    cannot say who the user is."""
    facts = dict(line.partition(" ")[::2] for line in output.splitlines())
    missing = [line.partition(" ")[2] for line in output.splitlines() if line.startswith("missing ")]
    if missing:
        raise ImageUnavailable(
            f"image {image!r} lacks {', '.join(missing)}, which the docker backend needs "
            "to enforce timeouts (BusyBox or coreutils/util-linux provide them)"
        )
    ids = facts.get("uid", "").strip(), facts.get("gid", "").strip()
    if not all(part.isdigit() for part in ids):
        raise ImageUnavailable(
            f"image {image!r}: cannot tell the ids of user {name or 'of the image'!r} (`id` failed)"
        )
    return SandboxUser(name, int(ids[0]), int(ids[1]), None if "home" in facts else FALLBACK_HOME)


def write_owned_by(chunks: Iterable[bytes], uid: int, gid: int, target: BinaryIO) -> int | None:
    """Write the tar stream of a directory, ``chunks``, to ``target`` with every entry's owner set
    to ``uid:gid``; the directory's mode when it was empty, else None.

    Entry by entry, so memory stays at a piece of one file however large the directory is.
    """
    entries, mode = 0, None
    with (
        tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as source,  # type: ignore[call-overload]
        tarfile.open(fileobj=target, mode="w|", format=tarfile.PAX_FORMAT) as rewritten,
    ):
        for member in source:
            member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
            rewritten.addfile(member, source.extractfile(member) if member.isfile() else None)
            entries, mode = entries + 1, member.mode & 0o7777 if entries == 0 else None
    return mode if entries == 1 else None
