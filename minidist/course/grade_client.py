"""nbclient for the grader (`grade_run`): a client that keeps going after errors, interrupts a
cell at the timeout (SIGINT, as the notebook's stop button), and tells a kernel that
ignored the interrupt, or died, from one that can go on."""

from __future__ import annotations

import os
from pathlib import Path

from . import grade_kernel, grade_sandbox


def client_for(nb, path: Path, timeout_s: float, sandbox: dict | None, scratch: str):
    """(the client, the kernel's environment). `sandbox`: {"hide": [folders]} to run the
    kernel under bubblewrap (`grade_sandbox.sandbox_prefix`)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionComplete

    scratch_dir = Path(scratch)
    prefix = None
    env = dict(os.environ)
    if sandbox is not None:
        prefix = grade_sandbox.sandbox_prefix(
            scratch_dir, path.parent.resolve(), [Path(p) for p in sandbox.get("hide", [])]
        )
        env = grade_sandbox.sandbox_env(scratch_dir)

    class Client(NotebookClient):
        timed_out = False
        abandoned: str | None = None
        output_cell = None  # the cell whose output bytes are counted (`over_limit`)
        output_kept = output_errors = 0
        output_noted = False

        async def _async_handle_timeout(self, timeout, cell=None):
            self.timed_out = True
            return await super()._async_handle_timeout(timeout, cell)

        def process_message(self, msg, cell, cell_index):
            """nbclient's, except that a malformed message (the learner's code can send any
            on the kernel's sockets: a stream without a `name`) becomes an error output of
            this cell instead of an exception that would stop the grader, and that a cell's
            outputs past OUTPUT_LIMIT bytes are dropped (`over_limit`)."""
            try:
                if over_limit(self, msg, cell):
                    return None
                return super().process_message(msg, cell, cell_index)
            except CellExecutionComplete:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                kind = msg.get("msg_type", "?") if isinstance(msg, dict) else type(msg).__name__
                cell.setdefault("outputs", []).append(malformed_output(kind, exc))
                return None

    client = Client(
        nb,
        timeout=timeout_s,
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellTimeout", "evalue": "interrupted", "traceback": []},
        resources={"metadata": {"path": str(path.parent.resolve())}},
        kernel_manager_class=grade_kernel.kernel_manager_class(prefix, scratch_dir),
        kernel_name="python3",
    )
    return client, env


OUTPUT_LIMIT = 32 << 20  # bytes of output kept per notebook (the rest: dropped, said so)
KEPT_ERRORS = 20  # error outputs kept per cell past the limit (a row may name one)


def over_limit(client, msg, cell) -> bool:
    """Whether to drop this output message: the notebook's outputs already hold
    OUTPUT_LIMIT bytes. A cell printing in a loop until its timeout would otherwise keep
    every line in the grader's memory (4 GB in 15 s) and stop the whole class; past the
    limit, a note in each cell says so and a cell's first KEPT_ERRORS error outputs are
    still kept."""
    if not isinstance(msg, dict) or msg.get("msg_type") not in OUTPUTS:
        return False
    if client.output_cell is not cell:  # a new cell
        client.output_cell, client.output_errors, client.output_noted = cell, 0, False
    size = len(repr(msg.get("content")))
    if client.output_kept + size <= OUTPUT_LIMIT:
        client.output_kept += size
        return False
    if msg["msg_type"] == "error" and client.output_errors < KEPT_ERRORS:
        client.output_errors += 1
        return False
    if not client.output_noted:  # the cell's first dropped message: say so, once
        import nbformat

        client.output_noted = True
        note = f"\n[output past the notebook's {OUTPUT_LIMIT >> 20} MB dropped by the grader]\n"
        cell.setdefault("outputs", []).append(
            nbformat.v4.new_output("stream", name="stderr", text=note)
        )
    return True


OUTPUTS = {"stream", "display_data", "execute_result", "error", "update_display_data"}


def malformed_output(kind: str, exc: Exception):
    """The error output that stands for a kernel message nbclient could not read."""
    import nbformat

    why = f"{type(exc).__name__}: {exc}"
    return nbformat.v4.new_output(
        "error",
        ename="MalformedKernelMessage",
        evalue=f"the kernel sent a malformed {kind!r} message ({why}); it was ignored",
        traceback=[],
    )


def run_cell(client, cell, index: int, timeout_s: float) -> str | None:
    """Run one cell; returns why the notebook cannot go on (None when it can)."""
    from nbclient.exceptions import DeadKernelError

    client.timed_out = False
    try:
        client.execute_cell(cell, index)
    except DeadKernelError:
        return f"the kernel died while running cell {index}"
    if client.timed_out and not kernel_answers(client):
        if kernel_exited(client):  # nbclient polls for a death; on a loaded machine the
            return f"the kernel died while running cell {index}"  # timeout may come first
        client.shutdown_kernel = "immediate"  # a graceful shutdown would wait for it
        return f"cell {index} hung past {timeout_s:g} s and ignored the interrupt"
    return None


def run_hidden(client, source: str) -> None:
    """Run the grader's own `source` in the kernel, outside the notebook and its history
    (`grade_kernel.IMPORTS`, before the first cell); a kernel that dies here is found dead
    by the notebook's first cell."""
    import nbformat
    from nbclient.exceptions import DeadKernelError

    cell = nbformat.v4.new_code_cell(source)
    client.nb.cells.append(cell)
    try:
        client.execute_cell(cell, len(client.nb.cells) - 1, store_history=False)
    except DeadKernelError:
        pass
    finally:
        client.nb.cells.pop()


def kernel_exited(client) -> bool:
    """Has the kernel's process (bubblewrap's, under the sandbox, which ends with it) ended?"""
    process = getattr(getattr(client.km, "provisioner", None), "process", None)
    return process is not None and process.poll() is not None


def kernel_answers(client) -> bool:
    """After an interrupted cell: does the kernel run a trivial cell within a few seconds?"""
    import nbformat
    from nbclient.exceptions import DeadKernelError

    ping = nbformat.v4.new_code_cell("pass")
    timeout, client.timeout = client.timeout, grade_kernel.PING_TIMEOUT_S
    client.nb.cells.append(ping)
    client.timed_out = False
    try:
        client.execute_cell(ping, len(client.nb.cells) - 1)
    except DeadKernelError:
        return False
    finally:
        client.timeout = timeout
        client.nb.cells.pop()
    answered, client.timed_out = not client.timed_out, True
    return answered
