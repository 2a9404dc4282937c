"""Stopping the JVMs and other servers the project starts as subprocesses in their own session."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(process: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> None:
    """Send `sig` to the process group of `process` (started with `start_new_session=True`) and
    reap it, SIGKILL if it is still there after `timeout_s`; a no-op when it is gone or None."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, sig)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
