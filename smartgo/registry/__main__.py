"""Run a registry as a plain process (until the supervisor's `--role registry` takes over).

    python -m smartgo.registry [--host 127.0.0.1] [--listen-port 9876] [--store-dir ~/namesrv]
                               [--tls-mode permissive --tls-cert-file C --tls-key-file K]

SIGTERM or SIGINT stops it cleanly (exit status 0).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from smartgo.net.loop import run
from smartgo.net.tls import MODES, ServerTls, server_options
from smartgo.registry.server import DEFAULT_PORT, DEFAULT_STORE_DIR, RegistryServer


async def serve(server: RegistryServer) -> None:
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m smartgo.registry", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    parser.add_argument("--listen-port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--store-dir", type=Path, default=DEFAULT_STORE_DIR, help="where kvConfig.json lives")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--tls-mode", choices=MODES, default="disabled", help="TLS on the port (tls.server.mode)")
    parser.add_argument("--tls-cert-file", default="", help="PEM certificate chain")
    parser.add_argument("--tls-key-file", default="", help="PEM private key")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        tls = server_options(ServerTls(args.tls_mode, args.tls_cert_file, args.tls_key_file))
    except (ValueError, OSError) as exc:
        parser.error(f"TLS: {exc}")
    run(serve(RegistryServer(args.host, args.listen_port, args.store_dir, tls=tls)))


if __name__ == "__main__":
    main()
