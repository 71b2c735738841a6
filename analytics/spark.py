"""The one place where SmartGo's Spark sessions are configured: quiet, fast and offline by default.

Local masters (the default ``local[*]``) bind the driver to loopback, run without the web UI,
with few shuffle partitions and WARN logs, so a laptop or CI run opens no port beyond
127.0.0.1 and prints nothing but our own progress line. A cluster master (``spark://``,
``yarn``, ``k8s://``) keeps the cluster's own networking and gets this code shipped to the
executors as a zip (see docs/ANALYTICS.md); the jobs themselves are the same code.
"""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("smartgo.analytics.spark")

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
_HERE = Path(__file__).resolve().parent
LOG4J_CONFIG = _HERE / "log4j2.properties"
SHIPPED_PACKAGES = ("smartgo", "analytics")  # what the executors import (record codec, data source)

# Every session, local or cluster.
COMMON_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # our own progress line replaces it
    "spark.sql.session.timeZone": "UTC",  # stats and store timestamps are epoch ms, shown in UTC
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "true",
    "spark.sql.python.filterPushdown.enabled": "true",  # the store source prunes on topic/time
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.catalogImplementation": "in-memory",  # no Hive metastore_db in the working directory
}

# Only for local masters: everything on loopback, and shuffles sized for a handful of cores.
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "4",
}


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def session_conf(master: str = DEFAULT_MASTER, extra: Mapping[str, str] | None = None,
                 short_job: bool = False) -> dict[str, str]:
    """The configuration session() applies, exposed for tests and documentation.

    short_job (local masters): JIT with C1 only. For a job that is over in a minute, such as
    the report, the C2 compiler's warm-up costs more CPU than it saves (measured: the 1-day
    report in about half the time); a long scan is about 15% cheaper with C2, so it stays
    the default."""
    conf = dict(COMMON_CONF)
    java_options = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    if is_local(master):
        conf.update(LOCAL_CONF)
        if short_job:
            java_options += " -XX:TieredStopAtLevel=1"
    conf["spark.driver.extraJavaOptions"] = java_options
    conf.update(extra or {})
    return conf


def session(master: str | None = None, app_name: str = "smartgo-analytics",
            conf: Mapping[str, str] | None = None, ship_code: bool | None = None, short_job: bool = False):
    """A SparkSession with SmartGo's defaults (getOrCreate: an active session is reused as is,
    except that the store data source is registered on it)."""
    from pyspark.sql import SparkSession

    master = master or os.environ.get("SMARTGO_SPARK_MASTER") or DEFAULT_MASTER
    local = is_local(master)
    if local:
        # The JVM resolves the host name before reading any conf; pin it to loopback too, and
        # make the Python workers use this interpreter (the one with smartgo installed).
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in session_conf(master, conf, short_job).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    for name in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if ship_code if ship_code is not None else not local:
        ship_packages(spark)
    from analytics.datasource import register

    register(spark)
    return spark


def package_zip(packages: Iterable[str] = SHIPPED_PACKAGES) -> bytes:
    """A zip of the given top-level packages' .py files (what executors need to import)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in packages:
            root = Path(importlib.import_module(name).__file__).resolve().parent  # type: ignore[arg-type]  # a package
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".properties") and "__pycache__" not in path.parts:
                    zf.write(path, f"{name}/{path.relative_to(root).as_posix()}")
    return buf.getvalue()


def ship_packages(spark) -> Path:
    """Send smartgo and analytics to every executor (SparkContext.addPyFile of one zip)."""
    fd, name = tempfile.mkstemp(prefix="smartgo-analytics-", suffix=".zip")
    with os.fdopen(fd, "wb") as f:
        f.write(package_zip())
    spark.sparkContext.addPyFile(name)
    log.info("shipped %s to the executors as %s", ", ".join(SHIPPED_PACKAGES), name)
    return Path(name)


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """--master, --conf and --ship-code, shared by every analytics command."""
    parser.add_argument("--master", default=None,
                        help=f"Spark master URL (default {DEFAULT_MASTER}, or $SMARTGO_SPARK_MASTER): "
                             "local[N], spark://host:7077, yarn, k8s://...")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", type=conf_item,
                        help="extra Spark configuration, repeatable (overrides SmartGo's defaults)")
    parser.add_argument("--ship-code", action=argparse.BooleanOptionalAction, default=None,
                        help="zip smartgo+analytics to the executors (default: on for cluster masters)")


def conf_item(text: str) -> tuple[str, str]:
    """argparse type of --conf KEY=VALUE."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--conf expects KEY=VALUE, got {text!r}")
    return key.strip(), value


@contextmanager
def cli_session(args: argparse.Namespace, app_name: str, short_job: bool = False) -> Iterator:
    """The session of a command: built from --master/--conf/--ship-code, stopped at the end
    unless it was already running (a caller's session, e.g. in tests, is left alone)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = session(args.master, app_name, dict(args.conf), args.ship_code, short_job)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
