"""The batch-marker test hook: inert unless armed; an armed hold ends when the marker is removed."""

from __future__ import annotations

import threading
import time

from service.config.sources import BATCH_MARKER_ENV
from service.runtime import test_hooks
from service.runtime.test_hooks import ARM_SUFFIX, hold_batch_if_armed


def test_without_the_variable_or_an_arm_file_a_batch_goes_on_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv(BATCH_MARKER_ENV, raising=False)
    hold_batch_if_armed("p", 1)
    marker = tmp_path / "marker"
    monkeypatch.setenv(BATCH_MARKER_ENV, str(marker))
    hold_batch_if_armed("p", 2)
    assert not marker.exists()


def test_an_armed_hold_marks_one_batch_and_waits_until_the_marker_is_removed(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv(BATCH_MARKER_ENV, str(marker))
    (tmp_path / f"marker{ARM_SUFFIX}").touch()
    seen: list[str] = []

    def release() -> None:
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(marker.read_text())
        marker.unlink()

    releaser = threading.Thread(target=release)
    releaser.start()
    hold_batch_if_armed("orders", 7)
    releaser.join(10)
    assert seen == ["orders 7\n"]
    assert not (tmp_path / f"marker{ARM_SUFFIX}").exists()
    hold_batch_if_armed("orders", 8)  # the arm was used up: no second hold
    assert not marker.exists()


def test_a_hold_is_bounded(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv(BATCH_MARKER_ENV, str(marker))
    monkeypatch.setattr(test_hooks, "HOLD_LIMIT_S", 0.2)
    (tmp_path / f"marker{ARM_SUFFIX}").touch()
    started = time.monotonic()
    hold_batch_if_armed("p", 1)
    assert 0.2 <= time.monotonic() - started < 5 and not marker.exists()
