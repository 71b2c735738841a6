"""The disk usage file the tests set (disk_usage_file): a rewrite in progress is not a reading."""

from __future__ import annotations

from smartgo.broker.actors.cleanup_actor import file_usage


def test_an_emptied_file_keeps_the_last_reading_and_garbage_or_no_file_reads_zero(tmp_path):
    path = tmp_path / "usage"
    path.write_text("0.93\n")
    read = file_usage(str(path))
    assert read("") == 0.93
    path.write_text("")          # Path.write_text truncates before it writes: a reader may see this
    assert read("") == 0.93      # read as 0 once, it let sends through a full disk (test_disk_and_flush)
    path.write_text("0.88")
    assert read("") == 0.88
    path.write_text("garbled")
    assert read("") == 0.0
    path.unlink()
    assert read("") == 0.0
