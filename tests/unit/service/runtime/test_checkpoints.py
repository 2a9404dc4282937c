"""Abandoned log writes of a killed run are removed before a query starts (pure file system)."""

from __future__ import annotations

from service.runtime.checkpoints import remove_abandoned_writes

LEFTOVER = ".0.cdccc0b8-6707-4491-8a59-21e238611936.tmp"  # as a SIGKILL left it in a chaos run


def test_leftover_temporary_log_files_are_removed_and_entries_kept(tmp_path):
    offsets, commits = tmp_path / "offsets", tmp_path / "commits"
    offsets.mkdir()
    commits.mkdir()
    (offsets / LEFTOVER).write_bytes(b"")
    (offsets / f".{LEFTOVER}.crc").write_bytes(b"")
    (offsets / "0").write_text("v1\n{}\n{}")
    (commits / ".3.0f0e-11.tmp").write_bytes(b"x")
    (commits / "2").write_text("v1\n{}")
    (tmp_path / "metadata").write_text("{}")

    removed = remove_abandoned_writes(str(tmp_path))

    assert sorted(removed) == sorted([f"offsets/{LEFTOVER}", f"offsets/.{LEFTOVER}.crc", "commits/.3.0f0e-11.tmp"])
    assert sorted(p.name for p in offsets.iterdir()) == ["0"]
    assert sorted(p.name for p in commits.iterdir()) == ["2"]
    assert (tmp_path / "metadata").exists()


def test_a_missing_or_remote_checkpoint_is_left_alone(tmp_path):
    assert remove_abandoned_writes(str(tmp_path / "not-yet")) == []
    assert remove_abandoned_writes("s3://bucket/checkpoints/p") == []
    assert remove_abandoned_writes(f"file://{tmp_path}") == []
