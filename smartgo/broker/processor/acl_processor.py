"""The ACL admin requests (4.x AdminBrokerProcessor's ACL handlers, what mqadmin updateAclConfig,
deleteAclConfig, updateGlobalWhiteAddr, clusterAclConfigVersion and getAccessConfigSubCommand
send): UPDATE_AND_CREATE_ACL_CONFIG (50), DELETE_ACL_CONFIG (51), GET_BROKER_CLUSTER_ACL_INFO
(52), UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53) and GET_BROKER_CLUSTER_ACL_CONFIG (54).

The broker actor serves them, one at a time, over the node's one ACL file (acl_guard.acl_path).
A change is written whole and atomically (persist.PersistedFile: the previous file stays as
plain_acl.yml.bak), then every net actor is told to load it at once ("acl" event); the event goes
out before the answer, so the client that made the change finds it in force. A change that cannot
be made (a bad permission, a short key, an unknown account, a file that does not load, a full
disk) is answered with 4.x's failure code and the reason, and the file stays as it was.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from smartgo.broker.acl import acl_file
from smartgo.broker.acl.acl_file import AclEditError
from smartgo.broker.acl.acl_guard import acl_path
from smartgo.broker.channel import ClientRef
from smartgo.common.acl_check import AclConfigError
from smartgo.common.acl_sign import AccessConfig, split_list
from smartgo.common.persist import PersistedFile
from smartgo.net import fastjson
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor

log = logging.getLogger(__name__)

ACL_OFF = "ACL is off on this broker (acl_enable=false), so it keeps no ACL file to change or read"


class AclProcessor:
    CODES = {RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: "update_account",
             RequestCode.DELETE_ACL_CONFIG: "delete_account",
             RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: "update_global_white",
             RequestCode.GET_BROKER_CLUSTER_ACL_INFO: "acl_version",
             RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: "acl_config"}

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker
        self.path = acl_path(broker.config).resolve()
        self.file = PersistedFile(self.path)
        self.enabled = broker.config.acl_enable

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def _change(self, client: ClientRef, request: RemotingCommand, failed: int, what: str,
                edit: Callable[[str, str, int], str]) -> RemotingCommand:
        """Reads the file, edits it, writes it and has the net actors load it; the answer says which."""
        if not self.enabled:
            return request.make_response(failed, ACL_OFF)
        try:
            text = edit(self._read(), str(self.path), int(time.time() * 1000))
            self.file.save(text.encode("utf-8"))
        except (AclEditError, AclConfigError, OSError, UnicodeDecodeError) as exc:
            log.warning("%s from %s refused, %s unchanged: %s", what, client.addr, self.path, exc)
            return request.make_response(failed, str(exc))
        self.b.channel.broadcast("acl")
        log.info("%s by %s: %s written", what, client.addr, self.path)
        return request.make_response(ResponseCode.SUCCESS)

    def update_account(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        update = AccessConfig.from_header(request.ext_fields or {})
        return self._change(client, request, ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED,
                            f"update of ACL account {update.access_key}",
                            lambda text, source, now: acl_file.update_account(text, update, source, now))

    def delete_account(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        access_key = request.ext_str("accessKey", "")
        return self._change(client, request, ResponseCode.DELETE_ACL_CONFIG_FAILED,
                            f"deletion of ACL account {access_key}",
                            lambda text, source, now: acl_file.delete_account(text, access_key, source, now))

    def update_global_white(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The header's aclFileFullPath may be left out (4.9's DefaultMQAdminExt does): it means
        the broker's file, the only one it has; another path is refused."""
        failed = ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        named = request.ext_str("aclFileFullPath", "")
        if named and self.enabled and Path(named).expanduser().resolve() != self.path:
            return request.make_response(failed, f"this broker's ACL file is {self.path}, not {named}")
        addresses = split_list(request.ext_str("globalWhiteAddrs", "")) or []
        return self._change(client, request, failed, "update of the global white list",
                            lambda text, source, now: acl_file.set_global_white(text, addresses, source, now))

    def _stamp_ms(self) -> int:
        try:
            return os.stat(self.path).st_mtime_ns // 1_000_000
        except OSError:
            return int(time.time() * 1000)

    def acl_version(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """GetBrokerAclConfigResponseHeader: the file's dataVersion, as "version" and keyed by its
        path in "allAclFileVersion" (4.9.3+ keeps one per file; this broker has one file)."""
        if not self.enabled:
            return request.make_response(ResponseCode.SYSTEM_ERROR, ACL_OFF)
        try:
            doc = acl_file.load(self._read(), str(self.path))
        except (AclEditError, OSError, UnicodeDecodeError) as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"cannot read {self.path}: {exc}")
        counter, stamp = acl_file.data_version(doc, self._stamp_ms())
        version = {"counter": counter, "timestamp": stamp}
        ident = self.b.identity
        return request.make_response(ResponseCode.SUCCESS, ext_fields={
            "version": fastjson.dumps(version).decode(),
            "allAclFileVersion": fastjson.dumps({str(self.path): version}).decode(),
            "brokerName": ident["broker"], "brokerAddr": ident["addr"], "clusterName": ident["cluster"]})

    def acl_config(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        if not self.enabled:
            return request.make_response(ResponseCode.SYSTEM_ERROR, ACL_OFF)
        try:
            body = acl_file.config_body(self._read(), str(self.path))
        except (AclEditError, AclConfigError, OSError, UnicodeDecodeError) as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"cannot read {self.path}: {exc}")
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(body))
