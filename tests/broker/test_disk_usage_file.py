"""The disk usage the watermarks read: statvfs as df counts it, or the file the tests set (disk_usage_file)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from smartgo.broker.actors.cleanup_actor import file_usage, statvfs_usage


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


def _df_percent(path: Path) -> int:
    out = subprocess.run(["df", "--output=pcent", str(path)], check=True, capture_output=True, text=True).stdout
    return int(out.splitlines()[-1].strip().rstrip("%"))


def test_statvfs_usage_reads_what_df_says(tmp_path):
    """The watermarks (75/85/90 %) compare against df's Use%: the root-reserved blocks are not room."""
    for path in (tmp_path, Path(__file__).parent):
        before = _df_percent(path)
        usage = statvfs_usage(str(path)) * 100
        after = _df_percent(path)
        # df rounds up; others write meanwhile, so allow the readings on either side of ours
        assert min(before, after) - 1 <= usage <= max(before, after), (path, before, usage, after)
