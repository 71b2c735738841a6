"""`smartgo admin` commands that take brokers out of service and back, change the brokers' and
registries' settings, and delete expired store files now (mqadmin wipeWritePerm, addWritePerm,
updateBrokerConfig, updateKvConfig, deleteKvConfig, getNamesrvConfig, updateNamesrvConfig,
deleteExpiredCommitLog, cleanExpiredCQ):

    smartgo admin wipe-write-perm --broker-name B | add-write-perm --broker-name B
    smartgo admin broker-config-update --key K --value V (--broker ADDR | --cluster C)
    smartgo admin kv-update --namespace NS --key K --value V | kv-delete ... | kv-get ...
    smartgo admin delete-expired-commitlog | clean-expired-cq [--broker ADDR | --cluster C]
    smartgo admin registry-config | registry-config-update --key orderMessageEnable --value true

Maintenance of one broker group without failed sends: `wipe-write-perm` at every registry, wait
until producers have re-read their routes (30 s with the SDK's and Java's defaults) and
`consumer-progress` shows the group's backlog there read, stop it, work, start it: it takes
sends again as it registers (`add-write-perm` when it was not restarted).
"""

from __future__ import annotations

import argparse

from smartgo.cli._common import CommandTable, broker_or_cluster, emit, options, table
from smartgo.client import AsyncAdmin

COMMANDS = CommandTable()
command = COMMANDS.command

BROKER_NAME = (("--broker-name",), {"required": True, "help": "the broker group (brokerName)"})


def _per_registry(args: argparse.Namespace, counts: dict[str, int], done: str) -> None:
    if args.json:
        emit({"broker_name": args.broker_name, "registries": counts})
        return
    print(f"{done} {args.broker_name}'s write perm")
    print(table(sorted(counts.items()), ("REGISTRY", "TOPICS")))


@command("wipe-write-perm", "producers stop sending to a broker group once they re-read their routes; consumers "
         "read on (every registry; WIPE_WRITE_PERM_OF_BROKER)", options(BROKER_NAME))
async def _wipe_write_perm(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _per_registry(args, await admin.wipe_write_perm(args.broker_name), "wiped")


@command("add-write-perm", "undo wipe-write-perm (every registry; ADD_WRITE_PERM_OF_BROKER)", options(BROKER_NAME))
async def _add_write_perm(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _per_registry(args, await admin.add_write_perm(args.broker_name), "gave back")


def _update_options(c: argparse.ArgumentParser) -> None:
    """broker-config-update's options: a function, not options(), for the required --broker | --cluster."""
    c.add_argument("--key", "-k", required=True, help="a runtime setting: broker_permission (brokerPermission), "
                                                      "auto_create_topic_enable, ...")
    c.add_argument("--value", "-v", required=True)
    broker_or_cluster(c, "every broker of this cluster, slaves too", required=True)


@command("broker-config-update", "change a broker's runtime setting, persisted by the broker (UPDATE_BROKER_CONFIG; "
         "mqadmin updateBrokerConfig)", _update_options)
async def _broker_config_update(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    addrs = await admin.update_broker_config({args.key: args.value}, cluster=args.cluster, broker_addr=args.broker)
    emit({"key": args.key, "value": args.value, "brokers": addrs}) if args.json else print(
        f"{args.key}={args.value} on {', '.join(addrs)}")


@command("registry-config", "every registry's settings (GET_NAMESRV_CONFIG; mqadmin getNamesrvConfig)", options())
async def _registry_config(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    configs = await admin.registry_configs()
    if args.json:
        emit({"registries": configs})
        return
    for registry, settings in configs.items():
        print(f"{registry}:")
        print(table(sorted(settings.items()), ("KEY", "VALUE")))


@command("registry-config-update", "change a registry setting at every registry, persisted there: "
         "orderMessageEnable (UPDATE_NAMESRV_CONFIG; mqadmin updateNamesrvConfig)",
         options((("--key", "-k"), {"required": True, "help": "orderMessageEnable: ORDER_TOPIC_CONFIG in routes"}),
                 (("--value", "-v"), {"required": True})))
async def _registry_config_update(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    registries = await admin.update_registry_config({args.key: args.value})
    emit({"key": args.key, "value": args.value, "registries": registries}) if args.json else print(
        f"{args.key}={args.value} at {', '.join(registries)}")


def _brokers(c: argparse.ArgumentParser) -> None:
    broker_or_cluster(c, "every broker of this cluster, slaves too (default: all clusters)")


def _minimums(args: argparse.Namespace, minimums: dict[str, int]) -> None:
    emit({"brokers": minimums}) if args.json else print(table(sorted(minimums.items()),
                                                             ("BROKER", "COMMITLOG MIN OFFSET")))


@command("delete-expired-commitlog", "delete CommitLog files older than file_reserved_hours now, not at "
         "delete_when's hour (DELETE_EXPIRED_COMMITLOG; 5.x mqadmin deleteExpiredCommitLog)", _brokers)
async def _delete_expired_commitlog(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _minimums(args, await admin.delete_expired_commitlog(cluster=args.cluster, broker_addr=args.broker))


@command("clean-expired-cq", "delete ConsumeQueue and index files below the CommitLog minimum now "
         "(CLEAN_EXPIRED_CONSUMEQUEUE; mqadmin cleanExpiredCQ)", _brokers)
async def _clean_expired_cq(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _minimums(args, await admin.clean_expired_consume_queue(cluster=args.cluster, broker_addr=args.broker))


NAMESPACE = (("--namespace", "-s"), {"required": True, "help": "e.g. ORDER_TOPIC_CONFIG (what topic-create --order "
                                                              "writes: brokerName:queues;...)"})
KEY = (("--key", "-k"), {"required": True})


@command("kv-update", "set a registry KV config item at every registry (PUT_KV_CONFIG; mqadmin updateKvConfig)",
         options(NAMESPACE, KEY, (("--value", "-v"), {"required": True})))
async def _kv_update(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    registries = await admin.put_kv_config(args.namespace, args.key, args.value)
    emit({"namespace": args.namespace, "key": args.key, "value": args.value, "registries": registries}) \
        if args.json else print(f"{args.namespace} {args.key}={args.value} at {', '.join(registries)}")


@command("kv-delete", "delete a registry KV config item at every registry (DELETE_KV_CONFIG; mqadmin deleteKvConfig)",
         options(NAMESPACE, KEY))
async def _kv_delete(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    registries = await admin.delete_kv_config(args.namespace, args.key)
    emit({"namespace": args.namespace, "key": args.key, "registries": registries}) if args.json else print(
        f"{args.namespace} {args.key} deleted at {', '.join(registries)}")


@command("kv-get", "a registry KV config item (GET_KV_CONFIG)", options(NAMESPACE, KEY))
async def _kv_get(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    value = await admin.kv_config(args.namespace, args.key)
    emit({"namespace": args.namespace, "key": args.key, "value": value}) if args.json else print(
        f"{args.namespace} {args.key}: {'(none)' if value is None else value}")
