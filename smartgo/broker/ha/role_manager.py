"""The broker actor's part of automatic failover (smartgo.broker.ha.failover has the role file).

- Registration carries the node's epoch (and, from a master, where its term began), which tells
  the failover registry an old master from the current one.
- A failover master is fenced, its sends refused as with brokerPermission read-only, until a
  failover registry has accepted it as master: an old master that comes back must not take
  writes that the new master's consumers would never see.
- A demotion (the registry's answer to an old master) or NOTIFY_BROKER_ROLE_CHANGED (the
  registry promoting this slave) is written to the role file, and the supervisor restarts the
  node in its new role; recovery cuts a demoted master's CommitLog first.
- The same notice to a master (an operator's switchover) fences it at once; the registry's
  answers keep the fence while the switchover lasts, and lift it if the switchover fails. The
  slave promoted by a switchover first copies the old master's tables once more (consumer and
  delay offsets as they stand: the old master's schedule actor has been holding still).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from smartgo.actors.logs import Repeats
from smartgo.broker.ha import failover
from smartgo.broker.ha.failover import RoleState
from smartgo.broker.recovery import load as recovered
from smartgo.broker.ha.slave_sync import SlaveSyncError, fetch_master_state
from smartgo.common.acl_sign import node_client
from smartgo.net.codes import NO_OFFSET, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand

FENCE_LOG_EVERY = 60.0          # s between the log lines of a master that no failover registry confirms
LAST_COPY_TIMEOUT = 3.0         # s per request of the last copy of the old master's tables (a switchover)

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor
    from smartgo.broker.channel import ClientRef


class RoleManager:
    CODES = {RequestCode.NOTIFY_BROKER_ROLE_CHANGED: "notify_role_changed"}

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker
        cfg = broker.config
        self.enabled = failover.enabled(cfg)
        self.state = failover.current(cfg)
        self.fenced = self.enabled and self.state.role == "master"
        self.changing = False               # a new role is written; the node restarts
        self._unconfirmed = Repeats(FENCE_LOG_EVERY)   # it registers every second meanwhile

    def start(self) -> None:
        """Record where a new master term began; forget a cut that recovery has made."""
        s = self.state
        if not self.enabled:
            return
        if s.role == "master" and s.epoch_start == NO_OFFSET:
            s = dataclasses.replace(s, epoch_start=recovered(self.b.ctx.run_path).written)
        elif s.role == "slave" and s.truncate_to != NO_OFFSET:
            s = dataclasses.replace(s, truncate_to=NO_OFFSET)
        if s != self.state:
            failover.save(self.b.config.store_path, s)
            self.state = s
        if self.fenced:
            self.b.log.info("failover master of epoch %d: sends wait for a failover registry's confirmation", s.epoch)

    def runtime_fields(self) -> dict[str, str]:
        """For GET_BROKER_RUNTIME_INFO (`smartgo admin cluster-list`, a switchover): the term, the
        fence, and the CommitLog end once the commit actor refuses writes for it (-1 before): read
        after its word, it is final, which a switchover's promotion starts from."""
        if not self.enabled:
            return {}
        board = self.b.board
        end = board.get("commitlog.written") if board.get("commit.fenced") else -1
        return {"failoverEpoch": str(self.state.epoch), "failoverFenced": str(self.fenced).lower(),
                "failoverFencedEnd": str(end)}

    def register_fields(self) -> dict[str, str]:
        if not self.enabled:
            return {}
        fields = {"failoverEpoch": str(self.state.epoch)}
        if self.state.role == "master":
            fields["epochStart"] = str(self.state.epoch_start)
        return fields

    def on_registered(self, answer: dict[str, str] | None) -> None:
        """After a registration round: answer is the failover registry's (None: none answered)."""
        if not self.enabled or self.changing:
            return
        if answer is None:
            if self.fenced and self._unconfirmed.check("unconfirmed") is not None:
                self.b.log.error("no failover registry has confirmed this master: sends stay refused (is "
                                 "failover_enable set on one of the registries %s?)", self.b.registrar.registries)
            return
        if answer.get("demote") == "true":
            try:
                state = RoleState("slave", int(answer["brokerId"]), int(answer["failoverEpoch"]),
                                  truncate_to=int(answer.get("truncateOffset", NO_OFFSET)))
            except (KeyError, ValueError) as exc:
                self.b.log.error("unreadable demotion from the failover registry %s: %s", answer, exc)
                return
            self._become(state, f"demoted: {answer.get('masterAddr')} is the master at epoch {state.epoch}")
        elif self.fenced:
            if answer.get("switching") == "true":
                return
            self.fenced = False
            self.b.publish_permission()
            self.b.log.info("failover registry confirmed this master at epoch %d: taking sends", self.state.epoch)
        elif self.state.role == "slave":
            self._follow(answer)

    def _follow(self, answer: dict[str, str]) -> None:
        """A slave learns of a later term before it replicates from that term's master: it records
        the epoch, or, holding more than the term's start (it was away at the election), cuts there."""
        try:
            epoch, cut = int(answer["failoverEpoch"]), int(answer.get("truncateOffset", NO_OFFSET))
        except (KeyError, ValueError) as exc:
            self.b.log.error("unreadable answer from the failover registry %s: %s", answer, exc)
            return
        if epoch <= self.state.epoch or cut == NO_OFFSET:
            return
        state = RoleState("slave", self.state.broker_id, epoch)
        # the ha actor may not have published yet: recovery's end is this node life's floor
        written = max(self.b.board.scalars()["commitlog.written"], recovered(self.b.ctx.run_path).written)
        if written > cut:
            self._become(dataclasses.replace(state, truncate_to=cut), f"the term of epoch {epoch} began at {cut}, "
                         f"and this slave holds the old master's CommitLog up to {written}")
        else:
            failover.save(self.b.config.store_path, state)
            self.state = state

    def notify_role_changed(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The failover registry promotes this slave, or hands this master's role to another broker
        (5.x's code; its header fields)."""
        epoch = request.ext_int("masterEpoch")
        if not self.enabled:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "failover_enable is off on this broker")
        if self.state.role == "master" and epoch > self.state.epoch and not self.changing:
            if not self.fenced:
                self.fenced = True
                self.b.publish_permission()
            self.b.log.warning("failover: %s hands the master role to %s at epoch %d: taking no more sends",
                               client.addr, request.ext_str("masterAddress"), epoch)
            return request.make_response(ResponseCode.SUCCESS)
        if self.state.role != "slave" or epoch <= self.state.epoch or self.changing:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"not a slave of an epoch before {epoch}: "
                                         f"{self.state.role} at epoch {self.state.epoch}")
        state, reason = RoleState("master", 0, epoch), f"promoted to master at epoch {epoch} by {client.addr}"
        handover = request.ext_str("syncFrom", "")
        if handover:
            self.changing = True
            self.b.spawn(self._last_copy(handover, state, reason), "last copy")
        else:
            self._become(state, reason)
        return request.make_response(ResponseCode.SUCCESS)

    async def _last_copy(self, master: str, state: RoleState, reason: str) -> None:
        """A switchover: the old master is alive and fenced, so its tables are final; copy them."""
        client = node_client(self.b.config)
        try:
            self.b.apply_master_state(await fetch_master_state(client, master, LAST_COPY_TIMEOUT))
        except SlaveSyncError as exc:
            self.b.log.warning("failover: no last copy of %s's tables (%s): the previous round's stands", master, exc)
        finally:
            await client.close()
        self._become(state, f"{reason}, with the last copy of {master}'s tables")

    def _become(self, state: RoleState, reason: str) -> None:
        failover.save(self.b.config.store_path, state)
        self.changing = True
        self.b.log.warning("failover: %s; restarting the node as %s %d", reason, state.role, state.broker_id)
        self.b.ctx.control.send({"op": "restart", "reason": reason})
