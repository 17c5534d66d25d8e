"""A download's file, as both clients write it: beside its target until it is whole, then
renamed into place, so the target is never left half-written; a failure removes the partial
file and is raised as the clients raise the server's failures."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

import httpx

from . import _core


class Download:
    """The partial file of one download and the bytes written to it."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.partial = _core.partial_path(target)
        self.written = 0
        self._out: Optional[BinaryIO] = None

    def begin(self, response: httpx.Response) -> None:
        """Checks the answer (its body read): raises the server's failure, else opens the
        partial file."""
        if not response.is_success:
            _core.result(response)
        self._out = self.partial.open("wb")

    def write(self, chunk: bytes) -> None:
        """Appends ``chunk``."""
        assert self._out is not None, "begin() opens the file"
        self._out.write(chunk)
        self.written += len(chunk)

    def _close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


@contextmanager
def download(file: Union[str, "os.PathLike[str]"], server: str) -> Iterator[Download]:
    """The download to ``file``: renamed into place when the block ends, removed when it
    fails (a failure to reach ``server`` raised as :class:`~nodus.ConnectionFailed`)."""
    into = Download(Path(file))
    try:
        yield into
        into._close()
    except httpx.TransportError as error:
        into._close()
        into.partial.unlink(missing_ok=True)
        raise _core.connection_error(server, error) from None
    except BaseException:
        into._close()
        into.partial.unlink(missing_ok=True)
        raise
    os.replace(into.partial, into.target)
