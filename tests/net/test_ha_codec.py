"""The HA stream codec (sans-IO): any split of the bytes gives the same frames; garbage is refused."""

from __future__ import annotations

import pytest

from smartgo.net.ha_codec import (HAProtocolError, ReportDecoder, Transfer, TransferDecoder, encode_header,
                                  encode_report)

pytestmark = pytest.mark.timeout(10)


def test_reports_are_int64_and_the_latest_whole_one_counts():
    d = ReportDecoder()
    stream = encode_report(0) + encode_report(4096) + encode_report(1 << 40)
    assert d.feed(stream[:5]) == -1                      # nothing whole yet
    assert d.feed(stream[5:12]) == 0
    assert d.feed(stream[12:20]) == 4096
    assert d.feed(stream[20:]) == 1 << 40
    assert d.feed(b"") == 1 << 40


@pytest.mark.parametrize("reports, error", [
    ([-5], "negative offset -5"),
    ([100, 50], "went back from 100 to 50"),
])
def test_bad_reports_are_refused(reports, error):
    d = ReportDecoder()
    with pytest.raises(HAProtocolError, match=error):
        for r in reports:
            d.feed(encode_report(r))


def test_transfer_frames_survive_any_split():
    frames = [(0, b"abc"), (3, b""), (3, bytes(range(256)) * 4), (1027, b"z")]
    stream = b"".join(encode_header(o, len(d)) + d for o, d in frames)
    for step in (1, 5, 12, 13, 700, len(stream)):
        d = TransferDecoder()
        got: list[Transfer] = []
        for i in range(0, len(stream), step):
            got += d.feed(stream[i:i + step])
        assert [(t.offset, t.data) for t in got] == frames
        assert d.buffered == 0


@pytest.mark.parametrize("header, error", [
    (encode_header(-1, 3), "offset -1"),
    (encode_header(0, -2), "size -2"),
    (encode_header(0, 9), "size 9 \\(at most 8 bytes\\)"),
])
def test_garbage_frames_are_refused_as_soon_as_their_header_arrives(header, error):
    with pytest.raises(HAProtocolError, match=error):
        TransferDecoder(max_transfer=8).feed(header)
