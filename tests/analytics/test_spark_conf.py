"""Spark defaults, time arguments, the executor zip and the progress line (no JVM needed)."""

from __future__ import annotations

import io
import zipfile

import pytest

from analytics.progress import Progress
from analytics.spark import conf_item, is_local, package_zip, session_conf
from analytics.timespec import format_time, parse_time


def test_local_sessions_are_quiet_and_loopback_only():
    conf = session_conf("local[2]")
    assert conf["spark.ui.enabled"] == "false" and conf["spark.ui.showConsoleProgress"] == "false"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert int(conf["spark.sql.shuffle.partitions"]) <= 8
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert "log4j2.configurationFile" in conf["spark.driver.extraJavaOptions"]
    assert "TieredStopAtLevel=1" not in conf["spark.driver.extraJavaOptions"]
    assert "TieredStopAtLevel=1" in session_conf("local[2]", short_job=True)["spark.driver.extraJavaOptions"]


def test_cluster_sessions_keep_the_cluster_network_and_extra_conf_wins():
    conf = session_conf("spark://h:7077", {"spark.sql.shuffle.partitions": "64"})
    assert "spark.driver.host" not in conf and conf["spark.sql.shuffle.partitions"] == "64"
    assert "TieredStopAtLevel" not in session_conf("yarn", short_job=True)["spark.driver.extraJavaOptions"]
    assert is_local("local[*]") and is_local("local") and not is_local("yarn")


def test_conf_item():
    assert conf_item("a.b=c=d") == ("a.b", "c=d")
    with pytest.raises(Exception, match="KEY=VALUE"):
        conf_item("novalue")


def test_package_zip_holds_what_executors_import():
    names = zipfile.ZipFile(io.BytesIO(package_zip())).namelist()
    for needed in ("smartgo/store/record.py", "smartgo/store/record_columns.py", "analytics/datasource.py",
                   "analytics/store_scan.py", "analytics/log4j2.properties"):
        assert needed in names
    assert not any("__pycache__" in n for n in names)


@pytest.mark.parametrize("text, ms", [
    ("1795000020000", 1_795_000_020_000),
    ("2026-11-18T11:47:00Z", 1_795_002_420_000),
    ("2026-11-18T12:47:00+01:00", 1_795_002_420_000),
    ("2026-11-18 11:47", 1_795_002_420_000),
    ("2026-11-18", 1_794_960_000_000),
])
def test_parse_time(text, ms):
    assert parse_time(text) == ms


def test_parse_time_rejects_garbage_and_formats_utc():
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_time("last tuesday")
    assert format_time(1_795_002_420_000) == "2026-11-18T11:47:00Z"


def test_progress_prints_one_line_per_step_off_a_terminal():
    out = io.StringIO()
    p = Progress(spark=None, total_steps=2, prefix="job", stream=out)
    with p.step("reading"):
        pass
    with p.step("writing"):
        pass
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[job 1/2] reading: done in") and lines[1].startswith("[job 2/2] writing: done")
