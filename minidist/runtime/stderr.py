"""The parent's end of each rank's stderr pipe: forward everything, keep the last lines.

Each rank's file descriptor 2 is a pipe to the parent, which copies everything to its own
file descriptor 2 (where the ranks' output would have gone anyway) and keeps the last lines
of each rank. A rank killed by a signal or an `abort()` leaves no traceback, only what
native code (gloo, NCCL) wrote to stderr just before; those lines go into the error.
"""

from __future__ import annotations

import os

_STDERR_TAIL_BYTES = 4000  # kept per rank
_STDERR_TAIL_LINES = 20  # of those, put into the error of a rank that died
_FATAL = b"Fatal Python error: "  # how faulthandler's dump of a dying rank begins
_FATAL_LINE_BYTES = 300  # of its first line, kept


class _StderrTail:
    """The parent's end of one rank's stderr pipe.

    Every chunk read is written to this process's file descriptor 2 (not `sys.stderr`: in
    Jupyter that would put rank noise into cell outputs) and the last few KB are kept for
    the error message should the rank die. Reads never block: under fork a pipe's write end
    may be held by more than the rank, so EOF is no sign that the rank is gone.
    """

    def __init__(self, conn):
        self.conn = conn
        os.set_blocking(conn.fileno(), False)
        self.tail = bytearray()
        self.trimmed = False
        self.eof = False
        # the tail as it was when faulthandler's dump began (the cause: what native code
        # wrote before it), and the dump's first line; the dump itself (every frame of the
        # stack, the extension modules) is forwarded, but would push the cause out of the tail
        self.before_fatal: bytes | None = None
        self.fatal_line = b""
        self._fatal_open = False  # its first line not ended yet: faulthandler writes it in parts

    def read(self) -> bool:
        """Read and forward what the pipe holds now (one chunk); False if nothing or EOF."""
        if self.eof:
            return False
        try:
            data = os.read(self.conn.fileno(), 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return False
        _write_fd2(data)
        seen = len(self.tail)
        self.tail += data
        rest = data if self._fatal_open else None
        if self.before_fatal is None:
            at = self.tail.find(_FATAL, max(0, seen - len(_FATAL)))
            if at >= 0:
                self.before_fatal, rest = bytes(self.tail[:at]), bytes(self.tail[at:])
        if rest is not None:
            line, newline, _ = rest.partition(b"\n")
            self.fatal_line = (self.fatal_line + line)[:_FATAL_LINE_BYTES]
            self._fatal_open = not newline and len(self.fatal_line) < _FATAL_LINE_BYTES
        if len(self.tail) > _STDERR_TAIL_BYTES:
            del self.tail[:-_STDERR_TAIL_BYTES]
            self.trimmed = True
        return True

    def drain(self, max_chunks: int = 64) -> None:
        """Read until the pipe is empty (bounded, should something keep writing)."""
        for _ in range(max_chunks):
            if not self.read():
                return

    def last_lines(self, n: int = _STDERR_TAIL_LINES) -> str:
        if self.before_fatal is not None and self.before_fatal.strip():
            cause = self.before_fatal.decode(errors="replace").rstrip().splitlines()[-(n - 1) :]
            return "\n".join([*cause, self.fatal_line.decode(errors="replace")])
        text = self.tail.decode(errors="replace")
        if self.trimmed and "\n" in text:
            text = text.split("\n", 1)[1]  # the first line was cut
        return "\n".join(text.rstrip().splitlines()[-n:])

    def close(self) -> None:
        self.eof = True
        self.conn.close()


def _write_fd2(data: bytes) -> None:
    try:
        while data:
            data = data[os.write(2, data) :]
    except OSError:
        pass  # our stderr is closed or full and non-blocking: the tail is still kept
