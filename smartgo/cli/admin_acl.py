"""`smartgo admin` commands for the brokers' plain ACL (mqadmin updateAclConfig, deleteAclConfig,
updateGlobalWhiteAddr, clusterAclConfigVersion, getAccessConfigSubCommand):

    smartgo admin acl-update --account AK [--account-secret SK] [--white-addr P] [--admin | --no-admin]
                             [--default-topic-perm PERM] [--default-group-perm PERM]
                             [--topic-perms T=PERM,...] [--group-perms G=PERM,...] [--cluster C | --broker ADDR]
    smartgo admin acl-delete --account AK [--cluster C | --broker ADDR]
    smartgo admin acl-white --addrs P,... [--cluster C | --broker ADDR]
    smartgo admin acl-version [--cluster C | --broker ADDR]
    smartgo admin acl-config --broker ADDR

The changes go to every broker of the cluster (all clusters by default), masters and slaves, as
each keeps its own file; on a broker that checks ACLs they need an admin account (--access-key).
"""

from __future__ import annotations

import argparse
import os

from smartgo.cli._common import CommandTable, emit, options, table, when
from smartgo.client import AsyncAdmin
from smartgo.common.acl_sign import AccessConfig, split_list

COMMANDS = CommandTable()
command = COMMANDS.command

ACCOUNT = (("--account",), {"required": True, "metavar": "AK", "help": "the account's accessKey"})
CLUSTER = (("--cluster", "-c"), {"help": "every broker of this cluster (default: of all clusters)"})
BROKER = (("--broker", "-b"), {"metavar": "HOST:PORT", "help": "only this broker"})
PERMS = "comma list of name=PERM (PERM: DENY, PUB, SUB or PUB|SUB); '' empties it"


def _done(args: argparse.Namespace, what: str, addrs: list[str]) -> None:
    emit({"done": what, "brokers": addrs}) if args.json else print(f"{what} on {', '.join(addrs)}")


@command("acl-update", "create an ACL account or change the fields given (UPDATE_AND_CREATE_ACL_CONFIG; mqadmin "
         "updateAclConfig)",
         options(ACCOUNT, (("--account-secret",), {"default": os.environ.get("SMARTGO_ACCOUNT_SECRET"), "metavar": "SK",
                                                   "help": "its secretKey, needed for a new account (default: "
                                                           "$SMARTGO_ACCOUNT_SECRET; prefer it, ps shows flags)"}),
                 (("--white-addr",), {"metavar": "PATTERN", "help": "addresses it is let in from unsigned"}),
                 (("--admin",), {"action": argparse.BooleanOptionalAction, "help": "may it administer (default: "
                                 "unchanged, no for a new account)"}),
                 (("--default-topic-perm",), {"metavar": "PERM"}), (("--default-group-perm",), {"metavar": "PERM"}),
                 (("--topic-perms",), {"metavar": "T=PERM,...", "help": PERMS}),
                 (("--group-perms",), {"metavar": "G=PERM,...", "help": PERMS}), CLUSTER, BROKER))
async def _acl_update(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    account = AccessConfig(args.account, args.account_secret or None, args.white_addr, args.admin,
                           args.default_topic_perm, args.default_group_perm, split_list(args.topic_perms),
                           split_list(args.group_perms))
    _done(args, f"ACL account {args.account} updated",
          await admin.update_acl_account(account, cluster=args.cluster, broker_addr=args.broker))


@command("acl-delete", "delete an ACL account (DELETE_ACL_CONFIG; mqadmin deleteAclConfig)",
         options(ACCOUNT, CLUSTER, BROKER))
async def _acl_delete(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _done(args, f"ACL account {args.account} deleted",
          await admin.delete_acl_account(args.account, cluster=args.cluster, broker_addr=args.broker))


@command("acl-white", "replace the global white list, the addresses let in without an account "
         "(UPDATE_GLOBAL_WHITE_ADDRS_CONFIG; mqadmin updateGlobalWhiteAddr)",
         options((("--addrs",), {"required": True, "metavar": "P,...", "help": "comma list of address patterns "
                                 "(10.1.1.*, 10.1.1.1-9, *); '' empties it"}), CLUSTER, BROKER))
async def _acl_white(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _done(args, "global white list updated",
          await admin.update_global_white_addrs(split_list(args.addrs) or [], cluster=args.cluster,
                                                broker_addr=args.broker))


@command("acl-version", "each broker's ACL file and its version, to see a change reached all "
         "(GET_BROKER_CLUSTER_ACL_INFO; mqadmin clusterAclConfigVersion)", options(CLUSTER, BROKER))
async def _acl_version(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    versions = await admin.acl_versions(cluster=args.cluster, broker_addr=args.broker)
    if args.json:
        emit({"brokers": [v.to_json() for v in versions]})
        return
    print(table([(v.cluster, v.broker_name, v.broker_addr, path, counter, when(stamp))
                 for v in versions for path, (counter, stamp) in sorted(v.files.items())],
                ("CLUSTER", "BROKER", "ADDRESS", "FILE", "VERSION", "UPDATED")))


@command("acl-config", "a broker's global white list and accounts, secret keys included "
         "(GET_BROKER_CLUSTER_ACL_CONFIG)", options((("--broker", "-b"), {"required": True, "metavar": "HOST:PORT"})))
async def _acl_config(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    config = await admin.acl_config(args.broker)
    if args.json:
        emit(config)
        return
    print("global white list: " + (", ".join(config.get("globalWhiteAddrs") or []) or "(empty)"))
    print(table([(a.get("accessKey"), "yes" if a.get("admin") else "no", a.get("whiteRemoteAddress") or "-",
                  a.get("defaultTopicPerm") or "-", a.get("defaultGroupPerm") or "-",
                  ",".join(a.get("topicPerms") or []) or "-", ",".join(a.get("groupPerms") or []) or "-")
                 for a in config.get("plainAccessConfigs") or []],
                ("ACCESS KEY", "ADMIN", "WHITE ADDRESS", "TOPIC DEFAULT", "GROUP DEFAULT", "TOPICS", "GROUPS")))
