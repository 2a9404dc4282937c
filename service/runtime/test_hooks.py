"""Hooks for tests that must act at a known point of a running service; inert unless enabled.

`CDC_LAKEHOUSE_TEST_BATCH_MARKER=<path>` (a test hook, not an operating option) lets a test hold
an ingest micro-batch open, for example to send SIGTERM while a batch is being processed:

1. the test creates `<path>.arm`;
2. the next micro-batch of any ingest pipeline that starts consumes the arm file, writes
   `<path>` (pipeline name and batch id) and waits before reading its data;
3. the test sees `<path>`, does what it needs (the batch is in flight), then removes `<path>`;
   the batch goes on. A batch is never held longer than `HOLD_LIMIT_S`.

Without the variable, or without an arm file, a batch goes on at once (one environment lookup).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from service.config.sources import batch_marker

ARM_SUFFIX = ".arm"
HOLD_LIMIT_S = 120.0
_POLL_S = 0.05

log = logging.getLogger(__name__)


def hold_batch_if_armed(pipeline: str, batch_id: int) -> None:
    """At the start of a micro-batch: if a test armed the hook, mark the batch and wait for release."""
    marker = batch_marker()
    if not marker:
        return
    arm = Path(marker + ARM_SUFFIX)
    try:
        arm.unlink()  # one armed hold per arm file, taken by the first batch that gets here
    except FileNotFoundError:
        return
    path = Path(marker)
    written = path.with_name(path.name + ".tmp")
    written.write_text(f"{pipeline} {batch_id}\n")
    written.replace(path)  # the test sees the marker whole or not at all
    log.warning("test hook: pipeline %s: batch %d held until %s is removed", pipeline, batch_id, path)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while path.exists() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    path.unlink(missing_ok=True)
