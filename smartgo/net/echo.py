"""A stand-alone remoting server for benchmarks and robustness tests of the remoting layer.

It answers SEND_MESSAGE_V2 the way a broker does (msgId, queueId, queueOffset, MSG_REGION,
TRACE_ON) without storing anything, and echoes any other code 0..999 back with its body.

    python -m smartgo.net.echo --port N [--host H] [--max-frame BYTES] [--loop uvloop|asyncio] [--busy-poll-us N]
                               [--tls-mode permissive|enforcing --tls-cert-file C --tls-key-file K]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.net.frame import DEFAULT_MAX_FRAME
from smartgo.net.loop import run
from smartgo.net.server import RemotingServer
from smartgo.net.tls import MODES, ServerTls, server_options

#: Codes this server does not serve, so clients can check REQUEST_CODE_NOT_SUPPORTED.
UNSUPPORTED_FROM = 1000


class EchoProcessors:
    def __init__(self) -> None:
        self.offset = 0

    @eager
    async def send(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        self.offset += 1
        return request.make_response(ResponseCode.SUCCESS, ext_fields={
            "msgId": "7F00000100002A9F0000000000001234", "queueId": request.ext_str("e", "0"),
            "queueOffset": str(self.offset), "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})

    @eager
    async def echo(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if request.code >= UNSUPPORTED_FROM:
            return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         f" request type {request.code} not supported")
        return request.make_response(ResponseCode.SUCCESS, ext_fields=request.ext_fields,
                                     body=request.body)


_NO_TLS = ServerTls()


def make_server(host: str, port: int, max_frame: int = DEFAULT_MAX_FRAME, busy_poll_us: int = 0,
                tls: ServerTls = _NO_TLS) -> RemotingServer:
    processors = EchoProcessors()
    return RemotingServer(host, [port], {RequestCode.SEND_MESSAGE_V2: processors.send},
                          default_processor=processors.echo, max_frame=max_frame, busy_poll_us=busy_poll_us,
                          **server_options(tls))


async def serve(host: str, port: int, max_frame: int, busy_poll_us: int = 0, tls: ServerTls = _NO_TLS) -> None:
    server = make_server(host, port, max_frame, busy_poll_us, tls)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"echo server pid {os.getpid()} on {host}:{server.port}", flush=True)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--cpu", type=int, help="pin the process to this CPU")
    parser.add_argument("--busy-poll-us", type=int, default=0, help="busy-poll window (smartgo.net.busy_poll)")
    parser.add_argument("--tls-mode", choices=MODES, default="disabled")
    parser.add_argument("--tls-cert-file", default="")
    parser.add_argument("--tls-key-file", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    tls = ServerTls(args.tls_mode, args.tls_cert_file, args.tls_key_file)
    run(serve(args.host, args.port, args.max_frame, args.busy_poll_us, tls), prefer_uvloop=args.loop == "uvloop")


if __name__ == "__main__":
    main()
