"""The pipe between the runner and a worker process: pickled messages, length-prefixed.

Both ends are trajkit's own processes (a worker is started by the runner and talks only to it),
so pickle is safe here. What is sent within one turn of the event loop leaves in one write: a
burst of outcomes or orders costs one system call, not one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
from typing import Any

HEADER = struct.Struct("!I")


class Channel:
    """One end of the socket pair, on the running event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: list[bytes] = []

    @classmethod
    async def connect(cls, sock: Any) -> Channel:
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**24)
        return cls(reader, writer)

    def send(self, *message: Any) -> None:
        """Queue ``message`` (a tuple whose first item names it); it leaves at the loop's next turn."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending += (HEADER.pack(len(data)), data)

    def flush(self) -> None:
        if self.pending and not self.writer.is_closing():
            self.writer.write(b"".join(self.pending))
        self.pending.clear()

    async def receive(self) -> tuple[Any, ...] | None:
        """The next message, or None once the other end has closed (or died)."""
        try:
            header = await self.reader.readexactly(HEADER.size)
            data = await self.reader.readexactly(HEADER.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        message: tuple[Any, ...] = pickle.loads(data)
        return message

    async def close(self) -> None:
        self.flush()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
