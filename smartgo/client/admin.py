"""AsyncAdmin: topic, group and message administration (Java's DefaultMQAdminExt, the calls
mqadmin makes), on the same instance machinery as the producers and consumers."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from smartgo.client import api, bodies, trace
from smartgo.client.bodies import AclVersion, BrokerStats, ConsumeStats, QueueProgress, QueueStatus, QueueTimeSpan
from smartgo.client.config import ClientConfig
from smartgo.client.errors import BrokerError, ClientError, NoRouteError
from smartgo.client.instance import ClientInstance
from smartgo.client.message import RESERVED_PROPERTIES, Message, MessageQueue, Prop, check_topic
from smartgo.client.producer import AsyncProducer
from smartgo.client.pull import pull, pull_sys_flag
from smartgo.client.route import BrokerData, TopicRouteData, order_conf
from smartgo.client.running_info import RunningInfo, parse_direct_result, parse_running_info
from smartgo.client.subscription import build_subscription
from smartgo.client.uniq_id import uniq_id_time
from smartgo.common.acl_sign import AccessConfig
from smartgo.net.codes import (DLQ_GROUP_TOPIC_PREFIX, MASTER_ID, ORDER_TOPIC_CONFIG, RETRY_GROUP_TOPIC_PREFIX,
                               TRANS_CHECK_MAX_TIME_TOPIC, PermName, RequestCode, dlq_topic, retry_topic)
from smartgo.net.codes import ResponseCode as R
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingError
from smartgo.store.errors import InvalidMessageIdError
from smartgo.store.record import MessageExt, parse_offset_msg_id

log = logging.getLogger(__name__)

LONG_MAX = (1 << 63) - 1
#: Requests a broker relays to a consumer (it waits 10 s for it); DefaultMQAdminExt allows 3 x 5 s.
RELAY_TIMEOUT = 15.0
ELECT_TIMEOUT = 30.0        # s: a switchover waits up to 10 s for the slave, then a node restart
T = TypeVar("T")
DLQ_RESEND_GROUP = "TOOLS_DLQ_RESEND"
#: Properties a DLQ message carries that a resent copy must not: the SDK's own and the broker's.
_NOT_RESENT = RESERVED_PROPERTIES | {"CLUSTER", Prop.CONSUME_START_TIME, Prop.MSG_REGION, Prop.TRACE_ON}


def _json_object(data: bytes) -> dict:
    obj = bodies.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


@dataclass(frozen=True, slots=True)
class Traffic:
    """A topic's messages in (group None) or a group's out of it: per second over the last
    minute, and in the last day (statsAll's InTPS / OutTPS and 24h sums)."""
    topic: str
    group: str | None
    tps: float
    day_sum: int

    def to_json(self) -> dict:
        return {"topic": self.topic, "group": self.group, "tps": round(self.tps, 2), "day_sum": self.day_sum}


@dataclass(slots=True)
class ClusterInfo:
    brokers: dict[str, BrokerData]
    clusters: dict[str, list[str]]

    def masters(self, cluster: str | None = None) -> list[tuple[str, str]]:
        """(broker name, master address) of a cluster (all clusters when None), sorted."""
        names = self.clusters.get(cluster, []) if cluster else list(self.brokers)
        return sorted((n, self.brokers[n].master_addr) for n in names  # type: ignore[misc]  # filtered: addresses set
                      if n in self.brokers and self.brokers[n].master_addr)

    def addrs(self, cluster: str | None = None) -> list[str]:
        """Every broker address, masters and slaves, of a cluster (all clusters when None)."""
        names = self.clusters.get(cluster, []) if cluster else list(self.brokers)
        return sorted(a for n in names if n in self.brokers for a in self.brokers[n].broker_addrs.values())

    def to_json(self) -> dict:
        return {"clusters": {c: sorted(names) for c, names in sorted(self.clusters.items())},
                "brokers": {n: {"cluster": b.cluster, "addrs": {str(k): v for k, v in sorted(b.broker_addrs.items())}}
                            for n, b in sorted(self.brokers.items())}}


def _properties(resp: RemotingCommand) -> dict[str, str]:
    """A Java properties text body (GET_BROKER_CONFIG, GET_NAMESRV_CONFIG) as a dict."""
    out = {}
    for line in resp.body_bytes().decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _properties_body(settings: dict[str, str]) -> bytes:
    """The properties text UPDATE_BROKER_CONFIG and UPDATE_NAMESRV_CONFIG take."""
    return "".join(f"{k}={v}\n" for k, v in settings.items()).encode()


class AsyncAdmin:
    def __init__(self, registry: str | list[str], *, config: ClientConfig | None = None,
                 **config_options: object) -> None:
        self.config = config or ClientConfig.make(registry, **config_options)
        self.instance = ClientInstance(self.config)

    async def start(self) -> AsyncAdmin:
        await self.instance.start()
        return self

    async def close(self) -> None:
        await self.instance.close()

    async def __aenter__(self) -> AsyncAdmin:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, addr: str, cmd: RemotingCommand, what: str, timeout: float | None = None,
                    ok: Iterable[int] = (R.SUCCESS,)) -> RemotingCommand:
        return api.check(await self.instance.invoke(addr, cmd, timeout), addr, what, ok)

    async def _registry(self, cmd: RemotingCommand, what: str, ok: Iterable[int] = (R.SUCCESS,)) -> RemotingCommand:
        return api.check(await self.instance.invoke_registry(cmd), "registry", what, ok)

    # -- cluster ----------------------------------------------------------------------------------

    async def cluster_info(self) -> ClusterInfo:
        resp = await self._registry(api.command(RequestCode.GET_BROKER_CLUSTER_INFO), "cluster info")
        try:
            obj = bodies.loads(resp.body_bytes()) if resp.body else {}
            brokers = {str(name): BrokerData.from_json(b, str(name))
                       for name, b in (obj.get("brokerAddrTable") or {}).items()}
            clusters = {str(c): sorted(str(n) for n in names)
                        for c, names in (obj.get("clusterAddrTable") or {}).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise BrokerError(R.SYSTEM_ERROR, f"malformed cluster info: {exc}", "registry", "cluster info") from None
        return ClusterInfo(brokers, clusters)

    async def _brokers(self, cluster: str | None, broker_addr: str | None, slaves: bool = False) -> list[str]:
        """broker_addr, else the masters (with slaves: every broker) of a cluster (all when None)."""
        if broker_addr:
            return [broker_addr]
        info = await self.cluster_info()
        if cluster and cluster not in info.clusters:
            raise ClientError(f"cluster {cluster!r} is unknown to the registry (known: {sorted(info.clusters)})")
        addrs = info.addrs(cluster) if slaves else [addr for _, addr in info.masters(cluster)]
        if not addrs:
            raise ClientError(f"no broker {'' if slaves else 'master '}is registered with the registry")
        return addrs

    async def elect_master(self, broker_name: str, broker_addr: str | None = None,
                           broker_id: int | None = None) -> dict[str, str]:
        """CONTROLLER_ELECT_MASTER (5.x's electMaster) at the registry that decides failover: hand
        broker_name's master role to its slave at broker_addr (or with broker_id; neither: the most
        advanced one). The master takes no more sends until the slave holds all it wrote, then the
        slave is promoted and the old master follows it. Returns the answer's fields
        (masterAddress, masterEpoch)."""
        cmd = api.command(RequestCode.CONTROLLER_ELECT_MASTER, {"brokerName": broker_name, "brokerAddress": broker_addr,
                                                                "brokerId": broker_id})
        refusals = []
        for registry in self.config.registry:       # only one decides; the others say so
            try:
                resp = await self.instance.invoke(registry, cmd, ELECT_TIMEOUT)
            except RemotingError as exc:
                refusals.append(f"{registry}: {exc}")
                continue
            if resp.code == R.SUCCESS:
                return dict(resp.ext_fields or {})
            refusals.append(f"{registry}: {resp.remark}")
        raise ClientError(f"no registry made the switchover of {broker_name}: " + "; ".join(refusals))

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int]:
        """WIPE_WRITE_PERM_OF_BROKER at every registry (mqadmin wipeWritePerm): producers send no
        more to broker_name once they have re-read its topics' routes (the SDK and Java every 30 s),
        consumers read on; until add_write_perm or its master restarts. The topics changed, per
        registry."""
        return await self._write_perm(RequestCode.WIPE_WRITE_PERM_OF_BROKER, broker_name, "wipeTopicCount",
                                      "wipe write perm")

    async def add_write_perm(self, broker_name: str) -> dict[str, int]:
        """ADD_WRITE_PERM_OF_BROKER at every registry (mqadmin addWritePerm): undo a wipe."""
        return await self._write_perm(RequestCode.ADD_WRITE_PERM_OF_BROKER, broker_name, "addTopicCount",
                                      "add write perm")

    async def _write_perm(self, code: int, broker_name: str, count: str, what: str) -> dict[str, int]:
        answers = await self._each_registry(api.command(code, {"brokerName": broker_name}), f"{what} of {broker_name}")
        return {registry: api.ext_long(resp, count, registry, what) for registry, resp in answers.items()}

    async def _each_registry(self, cmd: RemotingCommand, what: str) -> dict[str, RemotingCommand]:
        """cmd at each registry; the answers. Every registry is asked even after one fails
        (ClientError then names the failures and where it was done)."""
        done: dict[str, RemotingCommand] = {}
        failed: list[str] = []
        for registry in self.config.registry:
            try:
                done[registry] = await self._call(registry, cmd, what)
            except (RemotingError, BrokerError) as exc:
                failed.append(str(exc))
        if failed:
            raise ClientError(f"{what} failed: {'; '.join(failed)}" + (f" (done at {', '.join(done)})" if done else ""))
        return done

    async def put_kv_config(self, namespace: str, key: str, value: str) -> list[str]:
        """PUT_KV_CONFIG at every registry (mqadmin updateKvConfig); the registries."""
        cmd = api.command(RequestCode.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value})
        return list(await self._each_registry(cmd, f"put {namespace} {key}"))

    async def delete_kv_config(self, namespace: str, key: str) -> list[str]:
        """DELETE_KV_CONFIG at every registry (mqadmin deleteKvConfig); the registries."""
        cmd = api.command(RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key})
        return list(await self._each_registry(cmd, f"delete {namespace} {key}"))

    async def kv_config(self, namespace: str, key: str) -> str | None:
        """GET_KV_CONFIG at a registry: the value, None when it has none."""
        resp = await self._registry(api.command(RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}),
                                    f"get {namespace} {key}", ok=(R.SUCCESS, R.QUERY_NOT_FOUND))
        return (resp.ext_fields or {}).get("value") if resp.code == R.SUCCESS else None

    async def update_broker_config(self, settings: dict[str, str], *, cluster: str | None = None,
                                   broker_addr: str | None = None) -> list[str]:
        """UPDATE_BROKER_CONFIG (mqadmin updateBrokerConfig) at one broker, or every broker, slaves
        too, of the cluster (all when None): only runtime settings change (brokerPermission,
        autoCreateTopicEnable, ...), persisted by each broker; a broker refuses the whole update
        for any other. Returns the brokers' addresses."""
        addrs = await self._brokers(cluster, broker_addr, slaves=True)
        body = _properties_body(settings)
        await asyncio.gather(*(self._call(a, api.command(RequestCode.UPDATE_BROKER_CONFIG, body=body),
                                          "update broker config") for a in addrs))
        return addrs

    async def delete_expired_commitlog(self, *, cluster: str | None = None,
                                       broker_addr: str | None = None) -> dict[str, int]:
        """DELETE_EXPIRED_COMMITLOG (5.x's mqadmin deleteExpiredCommitLog) at one broker, or every
        broker of the cluster (all when None): CommitLog files older than file_reserved_hours go
        now, not at the hour of delete_when. Returns each broker's CommitLog minimum after."""
        return await self._clean(RequestCode.DELETE_EXPIRED_COMMITLOG, "delete expired CommitLog", cluster, broker_addr)

    async def clean_expired_consume_queue(self, *, cluster: str | None = None,
                                          broker_addr: str | None = None) -> dict[str, int]:
        """CLEAN_EXPIRED_CONSUMEQUEUE (mqadmin cleanExpiredCQ): ConsumeQueue and index files below
        the CommitLog minimum go now. Returns each broker's CommitLog minimum."""
        return await self._clean(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, "clean expired ConsumeQueue", cluster,
                                 broker_addr)

    async def _clean(self, code: int, what: str, cluster: str | None, broker_addr: str | None) -> dict[str, int]:
        async def one(addr: str) -> int:
            await self._call(addr, api.command(code), what)
            return int((await self.broker_runtime_info(addr)).get("commitLogMinOffset", 0))
        addrs = await self._brokers(cluster, broker_addr, slaves=True)
        return dict(zip(addrs, await asyncio.gather(*map(one, addrs))))

    async def mqtt(self, request: dict, *, cluster: str | None = None,
                   broker_addr: str | None = None) -> dict[str, dict]:
        """MQTT_ADMIN (SmartGo's own request) at one broker, or every broker of the cluster, slaves
        too (all when None): each broker's answer, merged from its MQTT actors (docs/CLIENT.md)."""
        async def one(addr: str) -> dict:
            cmd = api.command(RequestCode.MQTT_ADMIN, body=json.dumps(request).encode())
            resp = await self._call(addr, cmd, f"MQTT {request.get('op')}")
            try:
                return json.loads(resp.body_bytes())
            except ValueError as exc:
                raise BrokerError(R.SYSTEM_ERROR, f"undecodable JSON body: {exc}", addr, "MQTT admin") from None
        addrs = await self._brokers(cluster, broker_addr, slaves=True)     # a slave serves devices too
        return dict(zip(addrs, await asyncio.gather(*map(one, addrs))))

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: the broker's KVTable of runtime figures."""
        resp = await self._call(addr, api.command(RequestCode.GET_BROKER_RUNTIME_INFO), "broker runtime info")
        table = api.json_body(resp, addr, "broker runtime info")
        if not isinstance(table, dict) or not isinstance(table.get("table"), dict):
            raise BrokerError(R.SYSTEM_ERROR, "runtime info body is not a KVTable", addr, "broker runtime info")
        return {str(k): str(v) for k, v in table["table"].items()}

    async def broker_config(self, addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG: the broker's settings (a Java properties text body)."""
        return _properties(await self._call(addr, api.command(RequestCode.GET_BROKER_CONFIG), "broker config"))

    async def registry_configs(self) -> dict[str, dict[str, str]]:
        """GET_NAMESRV_CONFIG at every registry (mqadmin getNamesrvConfig): registry -> settings."""
        answers = await self._each_registry(api.command(RequestCode.GET_NAMESRV_CONFIG), "get registry config")
        return {registry: _properties(resp) for registry, resp in answers.items()}

    async def update_registry_config(self, settings: dict[str, str]) -> list[str]:
        """UPDATE_NAMESRV_CONFIG at every registry (mqadmin updateNamesrvConfig): only
        orderMessageEnable changes, persisted by each registry. Returns the registries."""
        cmd = api.command(RequestCode.UPDATE_NAMESRV_CONFIG, body=_properties_body(settings))
        return list(await self._each_registry(cmd, "update registry config"))

    # -- topics -----------------------------------------------------------------------------------

    async def create_topic(self, topic: str, queues: int = 8, *, write_queues: int | None = None,
                           perm: int = PermName.READ | PermName.WRITE, order: bool = False,
                           cluster: str | None = None, broker_addr: str | None = None) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC at every master of the cluster (all clusters when None) or at
        one broker; creates or updates. Returns the brokers' addresses."""
        check_topic(topic)
        addrs = await self._brokers(cluster, broker_addr)
        writes = queues if write_queues is None else write_queues
        await asyncio.gather(*(self._call(a, api.create_topic_request(topic, queues, writes, perm, order),
                                          f"create topic {topic}") for a in addrs))
        if order:
            await self._order_conf(topic, addrs, writes, merge=broker_addr is not None)
        return addrs

    async def _order_conf(self, topic: str, addrs: list[str], write_queues: int, merge: bool) -> None:
        """An ordered topic, as mqadmin updateTopic -o true: the registries' ORDER_TOPIC_CONFIG
        names its brokers and write queues ("broker-a:8;broker-b:8"), which the route carries
        (orderTopicConf) and producers then send by. For one broker the entry is merged into
        the topic's, for a cluster the value is replaced."""
        info = await self.cluster_info()
        entries = {name: write_queues for name, b in info.brokers.items() if set(b.broker_addrs.values()) & set(addrs)}
        old = await self.kv_config(ORDER_TOPIC_CONFIG, topic) if merge else None
        if old:
            entries = {**order_conf(old), **entries}
        await self.put_kv_config(ORDER_TOPIC_CONFIG, topic, ";".join(f"{n}:{q}" for n, q in sorted(entries.items())))

    async def delete_topic(self, topic: str, cluster: str | None = None) -> list[str]:
        """DELETE_TOPIC_IN_BROKER at the masters, then DELETE_TOPIC_IN_NAMESRV at every registry."""
        addrs = await self._brokers(cluster, None)
        await asyncio.gather(*(self._call(a, api.topic_request(RequestCode.DELETE_TOPIC_IN_BROKER, topic),
                                          f"delete topic {topic}") for a in addrs))
        for registry in self.config.registry:
            await self._call(registry, api.topic_request(RequestCode.DELETE_TOPIC_IN_NAMESRV, topic),
                             f"delete topic {topic} in registry")
        return addrs

    async def topic_list(self) -> list[str]:
        resp = await self._registry(api.command(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list")
        obj = api.json_body(resp, "registry", "topic list")
        return sorted(str(t) for t in (obj.get("topicList") or []))  # type: ignore[attr-defined]  # a JSON object

    async def topic_route(self, topic: str) -> TopicRouteData:
        route = await self.instance.fetch_route(topic)
        if route is None:
            raise NoRouteError(topic, "the registries have no route (topic does not exist?)")
        return route

    async def topic_status(self, topic: str) -> list[QueueStatus]:
        """Min/max offsets of every queue (GET_TOPIC_STATS_INFO at each master of the route)."""
        route = await self.topic_route(topic)
        out: list[QueueStatus] = []
        for b in route.broker_datas:
            addr = b.master_addr
            if addr is None:
                continue
            resp = await self._call(addr, api.topic_request(RequestCode.GET_TOPIC_STATS_INFO, topic),
                                    f"topic stats of {topic}")
            out += self._decoded(resp, addr, f"topic stats of {topic}", bodies.parse_topic_stats)
        return sorted(out, key=lambda s: s.queue)

    # -- groups -----------------------------------------------------------------------------------

    async def create_subscription_group(self, group: str, *, cluster: str | None = None,
                                        broker_addr: str | None = None, **options: object) -> list[str]:
        addrs = await self._brokers(cluster, broker_addr)
        body = api.subscription_group_body(group, **options)  # type: ignore[arg-type]  # fields by name
        await asyncio.gather(*(self._call(a, RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                                             body=body), f"create group {group}") for a in addrs))
        return addrs

    async def delete_subscription_group(self, group: str, *, cluster: str | None = None,
                                        broker_addr: str | None = None, remove_offsets: bool = False) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP at one broker or the masters of the cluster (all when None),
        with the group's offsets too if remove_offsets; then, as mqadmin deleteSubGroup, the
        group's retry and dead-letter topics where they exist. Returns the brokers' addresses."""
        addrs = await self._brokers(cluster, broker_addr)
        cmd = api.command(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "removeOffset": remove_offsets})
        await asyncio.gather(*(self._call(a, cmd, f"delete group {group}") for a in addrs))
        known = set(await self.topic_list())
        for topic in (retry_topic(group), dlq_topic(group)):
            if topic in known:
                await self.delete_topic(topic, cluster)
        return addrs

    async def _group_brokers(self, group: str, topic: str | None) -> list[str]:
        """Masters that may hold the group's offsets: those of the topic, else of the group's retry
        topic (brokers create it for every group), else every master."""
        if topic:
            return await self._topic_masters(topic)
        try:
            return await self._topic_masters(retry_topic(group))
        except NoRouteError:
            return await self._brokers(None, None)

    async def _topic_masters(self, topic: str) -> list[str]:
        return sorted({b.master_addr for b in (await self.topic_route(topic)).broker_datas if b.master_addr})

    async def _first_master(self, topic: str) -> str:
        masters = await self._topic_masters(topic)
        if not masters:
            raise ClientError(f"no broker of {topic} has a master")
        return masters[0]

    async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumeStats:
        """GET_CONSUME_STATS at each broker: per queue broker offset, group offset and lag."""
        stats = ConsumeStats()
        for addr in await self._group_brokers(group, topic):
            resp = await self._call(addr, api.consume_stats_request(group, topic), f"consume stats of {group}")
            one = self._decoded(resp, addr, f"consume stats of {group}", bodies.parse_consume_stats)
            stats.queues += one.queues
            stats.consume_tps += one.consume_tps
        stats.queues.sort(key=lambda q: q.queue)
        return stats

    async def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int,
                                   force: bool = True) -> dict[MessageQueue, int]:
        """Move the group's offsets in topic to the first message stored at or after timestamp_ms
        (-1: the end of each queue; force=False moves only backwards), as mqadmin resetOffsetByTime.
        Each master tells the group's online consumers (INVOKE_BROKER_TO_RESET_OFFSET), which move
        there at once; for an offline group the offsets are committed here (UPDATE_CONSUMER_OFFSET),
        and the group starts there when its consumers come. Returns the new offset of each queue."""
        out: dict[MessageQueue, int] = {}
        for broker in (await self.topic_route(topic)).broker_datas:
            addr = broker.master_addr
            if not addr:
                raise ClientError(f"broker {broker.broker_name} of {topic} has no master to reset offsets at")
            what = f"reset offsets of {group} in {topic}"
            resp = await self._call(addr, api.reset_offset_request(group, topic, timestamp_ms, force), what,
                                    ok=(R.SUCCESS, R.CONSUMER_NOT_ONLINE))
            if resp.code == R.SUCCESS:
                out.update(self._decoded(resp, addr, what, bodies.parse_reset_offsets))
            else:
                out.update(await self._reset_offline(addr, group, topic, timestamp_ms, force))
        return dict(sorted(out.items()))

    async def _reset_offline(self, addr: str, group: str, topic: str, timestamp_ms: int,
                             force: bool) -> dict[MessageQueue, int]:
        """mqadmin's fallback (ResetOffsetByTimeOldCommand): per queue the group has an offset for,
        search the timestamp and commit the result."""
        resp = await self._call(addr, api.consume_stats_request(group, topic), f"consume stats of {group}")
        queues = self._decoded(resp, addr, f"consume stats of {group}", bodies.parse_consume_stats).queues
        code, at = ((RequestCode.GET_MAX_OFFSET, None) if timestamp_ms == -1
                    else (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp_ms))
        out = {}
        for q in queues:
            mq = q.queue
            target = api.ext_long(await self.instance.invoke(addr, api.offset_request(code, topic, mq.queue_id, at)),
                                  "offset", addr, f"offset of {mq} at {timestamp_ms}")
            out[mq] = target if force or target < q.consumer_offset else q.consumer_offset
            await self._call(addr, api.update_consumer_offset_request(group, topic, mq.queue_id, out[mq]),
                             f"commit offset {out[mq]} of {mq} for {group}")
        return out

    async def topic_consumers(self, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO at each master of the topic: the groups with an online
        consumer subscribed to it or with offsets in it."""
        groups: set[str] = set()
        for addr in await self._topic_masters(topic):
            resp = await self._call(addr, api.command(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}),
                                    f"consumers of {topic}")
            obj = bodies.loads(resp.body_bytes()) if resp.body else {}
            listed = obj.get("groupList") if isinstance(obj, dict) else None
            if not isinstance(listed, list) or not all(isinstance(g, str) for g in listed):
                raise BrokerError(R.SYSTEM_ERROR, f"malformed GroupList: {obj!r:.200}", addr, f"consumers of {topic}")
            groups.update(listed)
        return sorted(groups)

    async def _first_answer(self, group: str, cmd: RemotingCommand, what: str, decode: Callable[[bytes], T],
                            timeout: float | None = None) -> T:
        """The first broker of the group that answers SUCCESS with a body that decodes; the
        first refusal if none does."""
        errors = []
        for addr in await self._group_brokers(group, None):
            resp = await self.instance.invoke(addr, cmd, timeout)
            if resp.code != R.SUCCESS:
                errors.append(BrokerError(resp.code, resp.remark, addr, what))
                continue
            try:
                return self._decoded(resp, addr, what, decode)
            except BrokerError as exc:
                errors.append(exc)
        raise errors[0] if errors else ClientError(f"no broker knows group {group}")

    async def consumer_connections(self, group: str) -> dict:
        """GET_CONSUMER_CONNECTION_LIST: the group's clients and subscriptions (ConsumerConnection)."""
        return await self._first_answer(group, api.consumer_connection_request(group),
                                        f"consumer connections of {group}", _json_object)

    async def consumer_running_info(self, group: str, client_id: str, jstack: bool = False) -> RunningInfo:
        """GET_CONSUMER_RUNNING_INFO: the consumer's own report (settings, subscriptions, queues
        held with their commit offsets and caches, pull and consume rates), relayed by a broker
        it is connected to. `jstack` asks for its threads' stacks too."""
        return await self._first_answer(group, api.running_info_request(group, client_id, jstack),
                                        f"running info of {client_id} in {group}", parse_running_info,
                                        RELAY_TIMEOUT)

    async def consume_message_directly(self, group: str, client_id: str, msg_id: str,
                                       topic: str | None = None) -> dict:
        """CONSUME_MESSAGE_DIRECTLY: one consumer of the group runs its listener on the message
        (either id; a UNIQ_KEY needs the topic), relayed by the broker that stores it. Nothing is
        committed or retried. ConsumeMessageDirectlyResult: consumeResult (CR_SUCCESS, CR_LATER,
        CR_THROW_EXCEPTION, ...), remark, spentTimeMills."""
        msg = (await self.query_by_id(msg_id, topic))[0]
        addr = f"{msg.store_host[0]}:{msg.store_host[1]}"
        what = f"consume {msg_id} directly at {client_id} of {group}"
        resp = await self._call(addr, api.consume_directly_request(group, client_id, msg.msg_id, msg.topic), what,
                                RELAY_TIMEOUT)
        return self._decoded(resp, addr, what, parse_direct_result)

    async def client_offsets(self, group: str, topic: str, client_id: str = "") -> dict[str, dict[MessageQueue, int]]:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS (mqadmin getConsumerStatus): the offsets each consumer of
        the group (or only client_id) holds in memory for topic, asked of them by a master of the
        topic; a consumer that cannot answer is left out."""
        cmd = api.command(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                          {"topic": topic, "group": group, "clientAddr": client_id})
        what = f"offsets held by the consumers of {group} in {topic}"
        addr = await self._first_master(topic)
        return self._decoded(await self._call(addr, cmd, what, RELAY_TIMEOUT), addr, what, bodies.parse_client_offsets)

    # -- statistics -------------------------------------------------------------------------------

    async def producer_connections(self, group: str, topic: str) -> list[dict]:
        """GET_PRODUCER_CONNECTION_LIST (mqadmin producerConnection) at the topic's masters: the
        group's producer connections (clientId, clientAddr, language, version), each client once."""
        found: dict[tuple, dict] = {}
        errors = []
        for addr in await self._topic_masters(topic):
            resp = await self.instance.invoke(addr, api.command(RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                                                {"producerGroup": group}))
            if resp.code != R.SUCCESS:
                errors.append(BrokerError(resp.code, resp.remark, addr, f"producer connections of {group}"))
                continue
            connections = self._decoded(resp, addr, f"producer connections of {group}", _json_object)
            for c in connections.get("connectionSet", []):
                found.setdefault((c.get("clientId"), c.get("clientAddr")), c)
        if not found and errors:
            raise errors[0]
        return [found[k] for k in sorted(found, key=str)]

    async def broker_stats(self, addr: str, stats_name: str, stats_key: str) -> BrokerStats | None:
        """VIEW_BROKER_STATS_DATA: one stats item of a broker (TOPIC_PUT_NUMS / TOPIC_PUT_SIZE by topic,
        GROUP_GET_NUMS / GROUP_GET_SIZE by topic@group, BROKER_PUT_NUMS / BROKER_GET_NUMS by cluster)
        over the last minute, hour and day; None when the broker has not counted it."""
        what = f"stats {stats_name} {stats_key}"
        resp = await self._call(addr, api.command(RequestCode.VIEW_BROKER_STATS_DATA,
                                                  {"statsName": stats_name, "statsKey": stats_key}), what,
                                ok=(R.SUCCESS, R.SYSTEM_ERROR))
        if resp.code != R.SUCCESS:
            if "not exist" in (resp.remark or ""):
                return None
            api.check(resp, addr, what)
        return self._decoded(resp, addr, what, bodies.parse_broker_stats)

    async def traffic(self, topics: Iterable[str] | None = None) -> list[Traffic]:
        """mqadmin statsAll: for each topic (default: every topic but retry and DLQ ones), the
        messages it took in over the last minute (per second) and day at its masters, and what each
        consuming group took out of it."""
        if topics is None:
            topics = [t for t in await self.topic_list()
                      if not t.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))]
        rows = []
        for topic in topics:
            masters = await self._topic_masters(topic)
            rows.append(await self._traffic(masters, topic, None, "TOPIC_PUT_NUMS", topic))
            for group in await self.topic_consumers(topic):
                rows.append(await self._traffic(masters, topic, group, "GROUP_GET_NUMS", f"{topic}@{group}"))
        return rows

    async def _traffic(self, masters: list[str], topic: str, group: str | None, name: str, key: str) -> Traffic:
        found = [s for s in [await self.broker_stats(addr, name, key) for addr in masters] if s is not None]
        return Traffic(topic, group, sum(s.minute.tps for s in found), sum(s.day_sum for s in found))

    async def broker_consume_stats(self, addr: str, order_only: bool = False) -> bodies.BrokerConsumeStats:
        """GET_BROKER_CONSUME_STATS (mqadmin brokerConsumeStats): every group of one broker with
        its lag per topic and queue, and the broker's total lag."""
        what = "broker consume stats"
        resp = await self._call(addr, api.command(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": order_only}),
                                what)
        return self._decoded(resp, addr, what, bodies.parse_broker_consume_stats)

    async def consume_time_span(self, topic: str, group: str) -> list[QueueTimeSpan]:
        """QUERY_CONSUME_TIME_SPAN at the topic's masters (DefaultMQAdminExt.queryConsumeTimeSpan):
        per queue, the time span of its messages, the group's position in it and its delay."""
        spans = []
        what = f"consume time span of {group} in {topic}"
        for addr in await self._topic_masters(topic):
            resp = await self._call(addr, api.command(RequestCode.QUERY_CONSUME_TIME_SPAN,
                                                      {"topic": topic, "group": group}), what)
            spans += self._decoded(resp, addr, what, bodies.parse_time_spans)
        return sorted(spans, key=lambda s: s.queue)

    async def query_consume_queue(self, topic: str, queue_id: int, index: int, count: int = 10,
                                  group: str | None = None, broker_addr: str | None = None) -> dict:
        """QUERY_CONSUME_QUEUE (mqadmin queryCq): up to count raw ConsumeQueue entries (physicOffset,
        physicSize, tagsCode) from index, at broker_addr or the topic's first master, with the
        queue's bounds and the group's subscription. No "queueData" when index is outside the queue."""
        addr = broker_addr or await self._first_master(topic)
        what = f"consume queue {topic}:{queue_id}"
        resp = await self._call(addr, api.command(RequestCode.QUERY_CONSUME_QUEUE, {
            "topic": topic, "queueId": queue_id, "index": index, "count": count, "consumerGroup": group}), what)
        return self._decoded(resp, addr, what, _json_object) if resp.body else {"remark": resp.remark}

    async def clone_group_offset(self, src: str, dest: str, topic: str | None = None,
                                 offline: bool = False) -> list[str]:
        """CLONE_GROUP_OFFSET at the masters holding src's offsets: dest's offsets in topic (or in
        every topic of src) become src's. Without offline, topics the online src no longer
        subscribes are skipped. Returns the brokers asked."""
        addrs = await self._group_brokers(src, topic)
        cmd = api.command(RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": src, "destGroup": dest, "topic": topic,
                                                           "offline": offline})
        await asyncio.gather(*(self._call(a, cmd, f"clone offsets of {src} to {dest}") for a in addrs))
        return addrs

    async def system_topics(self, addr: str) -> list[str]:
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER: the topics a broker keeps for itself."""
        what = "system topics"
        topics = self._decoded(await self._call(addr, api.command(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER), what),
                               addr, what, _json_object).get("topicList")
        if not isinstance(topics, list):
            raise BrokerError(R.SYSTEM_ERROR, "malformed TopicList", addr, what)
        return sorted(map(str, topics))

    @staticmethod
    def _decoded(resp: RemotingCommand, addr: str, what: str, parse: Callable[..., T], header: bool = False) -> T:
        """The response's body (or with header, its ext fields) parsed; one that does not parse
        is a BrokerError."""
        try:
            return parse(resp.ext_fields or {}) if header else parse(resp.body_bytes())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BrokerError(R.SYSTEM_ERROR, f"malformed answer: {exc}", addr, what) from None

    # -- ACL ---------------------------------------------------------------------------------------
    # mqadmin updateAclConfig / deleteAclConfig / updateGlobalWhiteAddr / clusterAclConfigVersion
    # send to every broker of a cluster, masters and slaves, as each keeps its own ACL file.

    async def _acl_change(self, cmd_code: int, fields: dict[str, str], what: str, cluster: str | None,
                          broker_addr: str | None) -> list[str]:
        addrs = await self._brokers(cluster, broker_addr, slaves=True)
        await asyncio.gather(*(self._call(a, api.command(cmd_code, fields), what) for a in addrs))
        return addrs

    async def update_acl_account(self, account: AccessConfig, *, cluster: str | None = None,
                                 broker_addr: str | None = None) -> list[str]:
        """UPDATE_AND_CREATE_ACL_CONFIG: creates the account (it then needs a secret key) or
        changes the fields given. Needs an admin account when the broker checks ACLs. Returns
        the brokers changed."""
        return await self._acl_change(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, account.to_header(),
                                      f"update ACL account {account.access_key}", cluster, broker_addr)

    async def delete_acl_account(self, access_key: str, *, cluster: str | None = None,
                                 broker_addr: str | None = None) -> list[str]:
        """DELETE_ACL_CONFIG at every broker (of the cluster) or one."""
        return await self._acl_change(RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key},
                                      f"delete ACL account {access_key}", cluster, broker_addr)

    async def update_global_white_addrs(self, patterns: Iterable[str], *, cluster: str | None = None,
                                        broker_addr: str | None = None) -> list[str]:
        """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: the addresses (patterns such as 10.1.1.*) let in without
        an account become `patterns`; an empty list lets in no one that way."""
        return await self._acl_change(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                                      {"globalWhiteAddrs": ",".join(patterns)}, "update the global white list",
                                      cluster, broker_addr)

    async def acl_versions(self, *, cluster: str | None = None, broker_addr: str | None = None) -> list[AclVersion]:
        """GET_BROKER_CLUSTER_ACL_INFO: each broker's ACL file versions, to see that a change reached all."""
        what = "ACL version"
        out = []
        for addr in await self._brokers(cluster, broker_addr, slaves=True):
            resp = await self._call(addr, api.command(RequestCode.GET_BROKER_CLUSTER_ACL_INFO), what)
            out.append(self._decoded(resp, addr, what, bodies.parse_acl_version, header=True))
        return out

    async def acl_config(self, broker_addr: str) -> dict:
        """GET_BROKER_CLUSTER_ACL_CONFIG: a broker's global white list and accounts as its file has
        them, secret keys included: {"globalWhiteAddrs": [...], "plainAccessConfigs": [...]}."""
        what = "ACL config"
        return self._decoded(await self._call(broker_addr, api.command(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG),
                                              what), broker_addr, what, _json_object)

    # -- messages ---------------------------------------------------------------------------------

    async def query_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                           end_ms: int = LONG_MAX, *, unique: bool = False,
                           replicas: bool = False) -> list[MessageExt]:
        """QUERY_MESSAGE at every master of the topic; messages whose KEYS (or UNIQ_KEY when
        unique) contain key, newest store time first. replicas: a broker whose master is gone or
        does not answer is asked at its slaves, and one none of whose addresses answers is left out."""
        route = await self.topic_route(topic)
        groups = [[addr for _, addr in sorted(b.broker_addrs.items())] if replicas else [b.master_addr]
                  for b in sorted(route.broker_datas, key=lambda b: b.broker_name)]
        request = api.query_message_request(topic, key, max_num, begin_ms, end_ms, unique)
        out: list[MessageExt] = []
        for addrs in groups:
            for addr in addrs:
                if not addr:
                    continue
                try:
                    resp = await self.instance.invoke(addr, request, 15.0)
                except (ClientError, RemotingError) as exc:
                    if not replicas:
                        raise
                    log.info("query %s by key %s: %s did not answer (%s); its replicas next", topic, key, addr, exc)
                    continue
                if resp.code != R.QUERY_NOT_FOUND:
                    api.check(resp, addr, f"query {topic} by key {key}")
                    out += api.decode_messages(resp.body_bytes(), addr, "query message")
                break
        if unique:
            out = [m for m in out if m.properties.get("UNIQ_KEY") == key]
        else:
            out = [m for m in out if key in m.keys]
        out.sort(key=lambda m: -m.store_timestamp)
        return out

    async def query_by_unique_key(self, topic: str, uniq_id: str) -> list[MessageExt]:
        """Messages whose UNIQ_KEY is uniq_id (a message retried by the producer may be stored
        more than once)."""
        try:
            begin = uniq_id_time(uniq_id) - 1000
        except (ValueError, IndexError):
            raise ClientError(f"{uniq_id!r} is not a message id (32 hex characters)") from None
        return await self.query_by_key(topic, uniq_id, 32, begin, LONG_MAX, unique=True)

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """VIEW_MESSAGE_BY_ID at the broker the offsetMsgId names."""
        try:
            host, port, offset = parse_offset_msg_id(offset_msg_id)
        except InvalidMessageIdError as exc:
            raise ClientError(str(exc)) from None
        addr = f"{host}:{port}"
        resp = await self._call(addr, api.view_message_request(offset), f"view message {offset_msg_id}")
        msgs = api.decode_messages(resp.body_bytes(), addr, "view message")
        if not msgs:
            raise BrokerError(R.SYSTEM_ERROR, "empty body", addr, f"view message {offset_msg_id}")
        return msgs[0]

    async def query_by_id(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """A message by either id. An offsetMsgId names its broker, so it is viewed there; a
        UNIQ_KEY (what SendResult.msg_id holds) needs the topic and is looked up in the index."""
        view_error: Exception | None = None
        try:
            host, port, _ = parse_offset_msg_id(msg_id)
            info = await self.cluster_info()
            known = {a for b in info.brokers.values() for a in b.broker_addrs.values()}
            if f"{host}:{port}" in known or topic is None:
                return [await self.view_message(msg_id)]
        except (ClientError, InvalidMessageIdError) as exc:
            view_error = exc
        if topic is None:
            raise ClientError(f"{msg_id} is not an offset message id of a known broker "
                              f"({view_error}); give the topic to look it up as a UNIQ_KEY")
        msgs = await self.query_by_unique_key(topic, msg_id)
        if not msgs:
            raise ClientError(f"no message with id {msg_id} in topic {topic}")
        return msgs

    async def query_by_offset(self, topic: str, queue_id: int, offset: int,
                              broker_name: str | None = None) -> MessageExt:
        """The message at (topic, queue, offset): one PULL as the TOOLS_CONSUMER group."""
        route = await self.topic_route(topic)
        self.instance.remember_route(topic, route)
        names = [b.broker_name for b in route.broker_datas if broker_name in (None, b.broker_name)]
        if not names:
            raise NoRouteError(topic, f"broker {broker_name} does not serve it")
        mq = MessageQueue(topic, names[0], queue_id)
        result = await pull(self.instance, api.TOOLS_CONSUMER_GROUP, mq, build_subscription(topic), offset, 1,
                            pull_sys_flag(False, False, True), 0, 0, 10.0, MASTER_ID)
        for msg in result.messages:
            if msg.queue_offset == offset:
                return msg
        raise ClientError(f"no message at offset {offset} of {mq} ({result.status.name}; the queue holds "
                          f"{result.min_offset}..{result.max_offset - 1})")

    async def dlq_messages(self, group: str, max_num: int = 32, offset: int = 0) -> list[MessageExt]:
        """Messages a consumer group gave up on (%DLQ%<group>, every broker), oldest first, from
        `offset` of each broker's queue."""
        return await self._browse(dlq_topic(group), max_num, offset)

    async def given_up_halves(self, max_num: int = 32, offset: int = 0) -> list[MessageExt]:
        """Transaction half messages the brokers' check-back gave up on (4.x's
        TRANS_CHECK_MAX_TIME_TOPIC, every broker), oldest first. Each one's REAL_TOPIC, PGROUP,
        UNIQ_KEY (the transaction's msgId) and TRANSACTION_CHECK_TIMES say which it was;
        resume_half puts one back."""
        return await self._browse(TRANS_CHECK_MAX_TIME_TOPIC, max_num, offset)

    async def resume_half(self, msg_id: str, topic: str = TRANS_CHECK_MAX_TIME_TOPIC) -> str:
        """RESUME_CHECK_HALF_MESSAGE (DefaultMQAdminExt.resumeCheckHalfMessage): the broker holding
        the half puts it back, and its check-back asks the producer group about the transaction
        again, from 0 checks. msg_id: the offsetMsgId of a given-up copy or of the half itself, or
        a transaction's UNIQ_KEY, looked up in `topic` (its latest copy there is resumed).
        Returns the offsetMsgId put back."""
        found = await self.query_by_id(msg_id, topic)
        half = max(found, key=lambda m: m.store_timestamp)
        host, port, _ = parse_offset_msg_id(half.msg_id)
        addr = f"{host}:{port}"
        await self._call(addr, api.command(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": half.msg_id}),
                         f"resume half message {half.msg_id}")
        return half.msg_id

    async def message_trace(self, msg_id: str, trace_topic: str = trace.TRACE_TOPIC, max_num: int = 64,
                            begin_ms: int = 0, end_ms: int = LONG_MAX) -> list[trace.TraceRecord]:
        """mqadmin queryMsgTraceById: the trace records of a traced message (by its msgId, the
        UNIQ_KEY a send returns), oldest first, from every trace message the index finds under
        that id (at most max_num of them). Each record's client_host is the host that wrote it.
        A SubAfter gets its SubBefore's group, region, retry count and, from a client that does not
        write it, its end time (Java's decoder leaves the group empty); consumption records get the
        topic of the send's record. Records that do not parse are skipped."""
        try:
            found = await self.query_by_key(trace_topic, msg_id, max_num, begin_ms, end_ms)
        except NoRouteError:
            return []                                   # no traced client ever wrote there
        records: list[trace.TraceRecord] = []
        for stored in found:
            got, _ = trace.decode(bytes(stored.body).decode("utf-8", "replace"))
            for rec in got:
                rec.client_host = stored.born_host[0]
            records += got
        started = {r.request_id: r for r in records if r.type is trace.TraceType.SUB_BEFORE}
        for rec in records:
            before = started.get(rec.request_id) if rec.type is trace.TraceType.SUB_AFTER else None
            if before is not None:
                rec.group, rec.region_id, rec.retry_times = before.group, before.region_id, before.retry_times
                rec.timestamp = rec.timestamp or before.timestamp + rec.cost_ms
        out = [r for r in records if r.msg_id == msg_id]
        topic = next((r.topic for r in out if r.topic), "")
        for rec in out:
            rec.topic = rec.topic or topic              # consumption records do not carry it
        out.sort(key=lambda r: r.timestamp)
        return out

    async def _browse(self, topic: str, max_num: int, offset: int) -> list[MessageExt]:
        """Up to max_num messages of every queue of every broker of a topic (none if it has no
        route), from `offset` of each queue."""
        try:
            route = await self.topic_route(topic)
        except NoRouteError:
            return []                                   # nothing was ever stored in it
        self.instance.remember_route(topic, route)
        out: list[MessageExt] = []
        sub = build_subscription(topic)
        for name in sorted(b.broker_name for b in route.broker_datas):
            for queue_id in range(max((q.read_queue_nums for q in route.queue_datas if q.broker_name == name),
                                      default=0)):
                at = offset
                while len(out) < max_num:
                    result = await pull(self.instance, api.TOOLS_CONSUMER_GROUP, MessageQueue(topic, name, queue_id),
                                        sub, at, min(32, max_num - len(out)), pull_sys_flag(False, False, True),
                                        0, 0, 10.0, MASTER_ID)
                    if not result.messages:
                        break
                    out += result.messages
                    at = result.next_begin_offset
        return out[:max_num]

    async def dlq_resend(self, group: str, msg_ids: Iterable[str] | None = None, *, to_topic: str | None = None,
                         max_num: int = 1024) -> list[tuple[MessageExt, str]]:
        """Send DLQ messages again - those whose offsetMsgId or UNIQ_KEY is in msg_ids, or every
        one (up to max_num) when msg_ids is None - to their original topic (RETRY_TOPIC) or
        to_topic: same body, tags, keys, UNIQ_KEY and user properties, reconsume count from 0.
        The resent message gets a new UNIQ_KEY (the old one stays in the DLQ copy). Returns
        (DLQ message, new offsetMsgId) pairs; the DLQ keeps its copies."""
        wanted = None if msg_ids is None else set(msg_ids)
        picked = [m for m in await self.dlq_messages(group, max_num if wanted is None else LONG_MAX)
                  if wanted is None or m.msg_id in wanted or m.uniq_key in wanted]
        if wanted is not None:
            missing = wanted - {m.msg_id for m in picked} - {m.uniq_key for m in picked}
            if missing:
                raise ClientError(f"not in {dlq_topic(group)}: {', '.join(sorted(missing))}")
        out = []
        async with AsyncProducer(DLQ_RESEND_GROUP, self.config.registry, send_timeout=self.config.timeout,
                                 config=replace(self.config, client_id="")) as producer:  # keys, TLS
            for m in picked:
                topic = to_topic or m.properties.get(Prop.RETRY_TOPIC)
                if not topic:
                    raise ClientError(f"{m.msg_id} has no RETRY_TOPIC property: give the topic to send it to")
                msg = Message(topic, m.body, tags=m.tags, keys=m.keys, flag=m.flag,
                              properties={k: v for k, v in m.properties.items() if k not in _NOT_RESENT})
                result = await producer.send(msg)
                out.append((m, result.offset_msg_id))
        return out

    async def broker_health(self, addr: str) -> dict:
        """Runtime info plus a verdict: reachable, answering and (when it reports them) its actors."""
        start = time.monotonic()
        info = await self.broker_runtime_info(addr)
        return {"broker": addr, "rtt_ms": round((time.monotonic() - start) * 1000, 2), "runtime": info}


__all__ = ["AsyncAdmin", "ClusterInfo", "ConsumeStats", "QueueProgress", "QueueStatus"]
