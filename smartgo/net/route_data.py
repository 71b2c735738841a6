"""QueueData and BrokerData (RocketMQ's common/protocol/route): what the registry stores and serves
and what clients read, with one definition and one JSON form for both sides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smartgo.net.codes import MASTER_ID


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        # topicSynFlag is the pre-4.9 name that the Go client still reads; both are written.
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSynFlag": self.topic_sys_flag, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, q: dict) -> QueueData:
        """KeyError, TypeError or ValueError for anything that is not queue data."""
        return cls(str(q["brokerName"]), int(q["readQueueNums"]), int(q["writeQueueNums"]), int(q["perm"]),
                   int(q.get("topicSysFlag", q.get("topicSynFlag", 0))))


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]          # brokerId -> address; 0 is the master

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def to_json(self) -> dict[str, Any]:
        return {"brokerAddrs": {str(i): self.broker_addrs[i] for i in sorted(self.broker_addrs)},
                "brokerName": self.broker_name, "cluster": self.cluster}

    @classmethod
    def from_json(cls, b: dict, name: str = "") -> BrokerData:
        """`name` when the body keys broker data by name (cluster info). TypeError or ValueError
        for anything that is not broker data."""
        return cls(str(b.get("cluster", "")), str(b.get("brokerName", name)),
                   {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()})
