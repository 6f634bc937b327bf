"""Run a command that starts processes of its own (torchrun's agent and its workers) in a
session of its own, and kill the whole session when it ends or times out: `subprocess.run`'s
timeout kills only the agent, and its workers would outlive the test."""

import os
import signal
import subprocess


def run_session(cmd, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the session is still alive
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
