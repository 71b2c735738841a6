"""A node restarted on a store with a damaged flushed record serves every other message."""

from __future__ import annotations

import pytest

from smartgo.broker.testing import pull_command, restart_broker, send_command
from smartgo.net.codes import ResponseCode
from smartgo.store.mapped_file import segment_name
from smartgo.store.record import POS_BODY, decode_records, parse_offset_msg_id

TOPIC = "Rot"


@pytest.mark.timeout(90)
def test_a_damaged_record_loses_only_its_message_after_a_restart(start_node):
    broker = start_node({"topics": f"{TOPIC}:1", "commitlog_file_size": 1 << 16})
    sent = []
    for i in range(60):
        r = broker.call(send_command(TOPIC, b"message %d " % i + b"x" * 200))
        assert r.code == ResponseCode.SUCCESS
        sent.append(parse_offset_msg_id(r.ext_fields["msgId"])[2])
    assert broker.node.stop() == 0                             # a clean stop flushes everything
    phys = sent[30]
    path = broker.node.store / "commitlog" / segment_name(phys - phys % (1 << 16))
    with open(path, "r+b") as f:                               # one flipped bit in a flushed body
        f.seek(phys % (1 << 16) + POS_BODY + 3)
        byte = f.read(1)[0]
        f.seek(phys % (1 << 16) + POS_BODY + 3)
        f.write(bytes([byte ^ 1]))
    broker.node = restart_broker(broker.node)
    bodies, offset = [], 0
    while True:
        r = broker.call(pull_command(TOPIC, 0, offset))
        if r.code != ResponseCode.SUCCESS:
            break
        bodies += [m.body.split(b" ")[1] for m in decode_records(r.body_bytes(), check_crc=True)]
        offset = int(r.ext_fields["nextBeginOffset"])
    assert bodies == [b"%d" % i for i in range(60) if i != 30]
    assert offset == 60
    assert broker.call(send_command(TOPIC, b"after")).ext_fields["queueOffset"] == "60"
    log = broker.node.log_text()
    assert "fail the record checks below the flushed offset" in log and "replaced by a filler" in log
    assert len(list((broker.node.store / "damaged").iterdir())) == 1
