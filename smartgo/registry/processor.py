"""One processor per registry request code (RocketMQ's namesrv DefaultRequestProcessor, split up).

Each reads its custom header through the typed accessors (a missing @CFNotNull field becomes
SYSTEM_ERROR "the custom field <x> is null"), validates the body fully, and only then touches the
tables. All but CONTROLLER_ELECT_MASTER (a switchover takes seconds) run eagerly inside the read
(smartgo.net.connection.eager).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable

from smartgo.common.bodies import BodyError
from smartgo.common.properties import parse_properties
from smartgo.net.codes import MASTER_ID, ORDER_TOPIC_CONFIG, MQVersion, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, Processor, eager
from smartgo.net.errors import HeaderFieldError
from smartgo.registry import bodies
from smartgo.registry.controller import NO_OFFSET, FailoverController, SwitchoverError
from smartgo.registry.kv_config import KVConfigManager
from smartgo.registry.registry_config import BlackListed, RegistryConfig
from smartgo.registry.route_info import RouteInfoManager

log = logging.getLogger(__name__)

OK = ResponseCode.SUCCESS


def _non_empty(request: RemotingCommand, name: str) -> str:
    value = request.ext_str(name)
    if not value:
        raise HeaderFieldError(name, f"the custom field {name} is empty")
    return value


def _broker_id(request: RemotingCommand) -> int:
    broker_id = request.ext_int("brokerId")
    if broker_id < 0:
        raise HeaderFieldError("brokerId", f"the custom field brokerId is negative: {broker_id}")
    return broker_id


class RegistryProcessors:
    def __init__(self, routes: RouteInfoManager, kv: KVConfigManager,
                 controller: FailoverController | None = None, config: RegistryConfig | None = None) -> None:
        self.routes = routes
        self.kv = kv
        self.config = config or RegistryConfig(kv.path.parent)     # the server's, loaded at its start
        self.controller = controller          # automatic failover decides here (failover_enable)
        self._master_epochs: dict[str, int] = {}   # failover masters' epochs, where no controller decides
        # Encoded route answers by topic, valid while the tables, the KV config and orderMessageEnable stay:
        # clients ask far more often (every 30 s each) than brokers change anything.
        self._routes_cached: dict[str, bytes] = {}
        self._cache_version: tuple[int, int, bool] = (-1, -1, False)

    def table(self) -> dict[int, Processor]:
        return {
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_list_by_namespace,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self._write_perm(self.routes.wipe_write_perm_of_broker, "wiped",
                                                                    "wipeTopicCount"),
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self._write_perm(self.routes.add_write_perm_of_broker, "gave back",
                                                                   "addTopicCount"),
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.CONTROLLER_ELECT_MASTER: self.elect_master,
            RequestCode.GET_NAMESRV_CONFIG: self.get_namesrv_config,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_namesrv_config,
        }

    # -- brokers --------------------------------------------------------------------------------

    @eager
    async def register_broker(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        cluster = _non_empty(request, "clusterName")
        broker_name = _non_empty(request, "brokerName")
        broker_addr = _non_empty(request, "brokerAddr")
        ha_server_addr = request.ext_str("haServerAddr")
        broker_id = _broker_id(request)
        body = request.body_bytes()
        crc = request.ext_int("bodyCrc32", 0)
        if crc and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
            log.warning("REGISTER_BROKER from %s: body CRC32 mismatch", conn.remote_address)
            return request.make_response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        parsed = bodies.parse_register_broker_body(body, request.ext_bool("compressed", False),
                                                   legacy=request.version < MQVersion.V3_0_11)
        refusal = self._failover_refusal(request, broker_name, broker_addr, broker_id)
        if refusal is not None:
            return refusal
        result = self.routes.register_broker(cluster, broker_addr, broker_name, broker_id, ha_server_addr,
                                             parsed, conn)
        controller = self.controller
        failover = controller is not None and "failoverEpoch" in (request.ext_fields or {})
        ext = controller.answer(broker_name, request.ext_int("failoverEpoch")) if controller and failover else {}
        if result.master_addr is not None:
            ext["masterAddr"] = result.master_addr
        if result.ha_server_addr is not None:
            ext["haServerAddr"] = result.ha_server_addr
        order = self.kv.namespace(ORDER_TOPIC_CONFIG)
        return request.make_response(OK, ext_fields=ext, body=bodies.encode_kv_table(order) if order else None)

    def _failover_refusal(self, request: RemotingCommand, name: str, addr: str,
                          broker_id: int) -> RemotingCommand | None:
        """Automatic failover's say on a registration (smartgo.registry.controller); None: go on."""
        epoch = request.ext_int("failoverEpoch") if "failoverEpoch" in (request.ext_fields or {}) else None
        controller = self.controller
        if controller is None:
            return self._older_master(request, name, addr, broker_id, epoch)
        if epoch is None:
            rival = controller.rival(name, addr) if broker_id == MASTER_ID else None
            if rival is None:
                return None
            log.error("REGISTER_BROKER of %s as master of %s refused: %s is its master under automatic failover, "
                      "and this broker has failover_enable off", addr, name, rival)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"failover: {rival} is the master of {name}; "
                                         "set failover_enable on this broker to join as its slave")
        demotion = controller.on_register(name, addr, broker_id, epoch, request.ext_int("epochStart", NO_OFFSET))
        if demotion is None:
            return None
        return request.make_response(ResponseCode.SYSTEM_ERROR, f"failover: {demotion.master} is the master of "
                                     f"{name} at epoch {demotion.epoch}; go on as its slave {demotion.broker_id}",
                                     ext_fields=demotion.ext(controller.ha_addr(demotion.master)))

    def _older_master(self, request: RemotingCommand, name: str, addr: str, broker_id: int,
                      epoch: int | None) -> RemotingCommand | None:
        """A registry that does not decide still keeps a failover master's route from an older
        master: a returning old master registers everywhere before the deciding registry demotes it."""
        if epoch is None or broker_id != MASTER_ID:
            return None
        broker = self.routes.broker_addr_table.get(name)
        current = broker.broker_addrs.get(MASTER_ID) if broker is not None else None
        newer = self._master_epochs.get(current, -1) if current is not None else -1
        if current != addr and current in self.routes.broker_live_table and newer > epoch:
            log.warning("REGISTER_BROKER of %s as master of %s at epoch %d refused: %s is its master at epoch %d",
                        addr, name, epoch, current, newer)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"failover: {current} is the master of {name} "
                                         f"at epoch {newer}")
        self._master_epochs[addr] = epoch
        return None

    @eager
    async def unregister_broker(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        self.routes.unregister_broker(request.ext_str("clusterName"), request.ext_str("brokerAddr"),
                                      request.ext_str("brokerName"), request.ext_int("brokerId"))
        return request.make_response(OK)

    @eager
    async def query_data_version(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        for name in ("brokerName", "clusterName"):
            request.ext_str(name)
        broker_addr = request.ext_str("brokerAddr")
        _broker_id(request)
        version = bodies.parse_data_version(bodies.load_json(request.body_bytes(), "DataVersion"))
        changed = self.routes.is_broker_topic_config_changed(broker_addr, version)
        if not changed:
            self.routes.update_broker_info_update_timestamp(broker_addr)
        ours = self.routes.query_broker_topic_config(broker_addr)
        return request.make_response(OK, ext_fields={"changed": "true" if changed else "false"},
                                     body=bodies.encode_data_version(ours) if ours is not None else None)

    def _write_perm(self, change: Callable[[str], int], done: str, count_field: str) -> Processor:
        """WIPE_WRITE_PERM_OF_BROKER 205 and ADD_WRITE_PERM_OF_BROKER 327: change(brokerName) counts
        the topics it changed."""
        @eager
        async def process(conn: Connection, request: RemotingCommand) -> RemotingCommand:
            name = request.ext_str("brokerName")
            count = change(name)
            log.info("%s the write perm of broker %s on %d topics (asked by %s)", done, name, count,
                     conn.remote_address)
            return request.make_response(OK, ext_fields={count_field: str(count)})
        return process

    async def elect_master(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """5.x's electMaster: hand a broker name's master role to the slave named by brokerAddress
        (5.0) or brokerId (5.1 on), or to its most advanced one (neither given); a switchover on
        this registry's FailoverController."""
        name = _non_empty(request, "brokerName")
        target: str | None = request.ext_str("brokerAddress", "") or None
        if target is None and request.ext_str("brokerId", ""):
            broker = self.routes.broker_addr_table.get(name)
            target = broker.broker_addrs.get(_broker_id(request), "") if broker is not None else ""
            if not target:
                return request.make_response(ResponseCode.SYSTEM_ERROR, f"{name} has no broker with brokerId "
                                             f"{request.ext_str('brokerId')}")
        if self.controller is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "this registry does not decide failover "
                                         "(failover_enable is off)")
        chosen = target or "its most advanced slave"
        log.warning("%s asks to make %s the master of %s", conn.remote_address, chosen, name)
        try:
            term = await self.controller.switchover(name, target)
        except SwitchoverError as exc:
            log.error("switchover of %s to %s: %s", name, chosen, exc)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"switchover: {exc}")
        return request.make_response(OK, ext_fields={"masterAddress": term.master, "newMasterAddress": term.master,
                                                     "masterBrokerId": str(MASTER_ID), "masterEpoch": str(term.epoch)})

    # -- routes ---------------------------------------------------------------------------------

    @eager
    async def get_route_info_by_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topic = request.ext_str("topic")
        version = (self.routes.version, self.kv.version, self.config.order_message_enable)
        if version != self._cache_version:
            self._routes_cached.clear()
            self._cache_version = version
        body = self._routes_cached.get(topic)
        if body is None:
            route = self.routes.pickup_topic_route(topic)
            if route is None:
                return request.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                             f"No topic route info in name server for the topic: {topic}")
            order = self.kv.get(ORDER_TOPIC_CONFIG, topic) if self.config.order_message_enable else None
            body = bodies.encode_topic_route(route, order)
            self._routes_cached[topic] = body
        return request.make_response(OK, body=body)

    @eager
    async def get_broker_cluster_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        body = bodies.encode_cluster_info(self.routes.broker_addr_table, self.routes.cluster_addr_table)
        return request.make_response(OK, body=body)

    @eager
    async def get_all_topic_list(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(OK, body=bodies.encode_topic_list(self.routes.all_topics()))

    @eager
    async def get_topics_by_cluster(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topics = self.routes.topics_by_cluster(request.ext_str("cluster"))
        return request.make_response(OK, body=bodies.encode_topic_list(topics))

    @eager
    async def delete_topic_in_namesrv(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        self.routes.delete_topic(request.ext_str("topic"), request.ext_str("clusterName", None))
        return request.make_response(OK)

    # -- the registry's settings ----------------------------------------------------------------

    @eager
    async def get_namesrv_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(OK, body=self.config.properties_text().encode())

    @eager
    async def update_namesrv_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            changed = self.config.update(parse_properties(request.body_bytes(), "registry config"))
        except BlackListed as exc:
            return request.make_response(ResponseCode.NO_PERMISSION, str(exc))
        except BodyError as exc:
            log.warning("registry config update from %s refused: %s", conn.remote_address, exc)
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        if changed:
            log.info("registry config changed by %s: %s", conn.remote_address, changed)
        return request.make_response(OK)

    # -- KV config ------------------------------------------------------------------------------

    @eager
    async def put_kv_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        self.kv.put(_non_empty(request, "namespace"), _non_empty(request, "key"), request.ext_str("value"))
        return request.make_response(OK)

    @eager
    async def get_kv_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        namespace, key = request.ext_str("namespace"), request.ext_str("key")
        value = self.kv.get(namespace, key)
        if value is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         f"No config item, Namespace: {namespace} Key: {key}")
        return request.make_response(OK, ext_fields={"value": value})

    @eager
    async def delete_kv_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        self.kv.delete(request.ext_str("namespace"), request.ext_str("key"))
        return request.make_response(OK)

    @eager
    async def get_kv_list_by_namespace(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        namespace = request.ext_str("namespace")
        table = self.kv.namespace(namespace)
        if not table:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return request.make_response(OK, body=bodies.encode_kv_table(table))
