"""Automatic failover, the registry's side (failover_enable; 5.x's controller, reduced).

A broker with failover_enable says so in every registration (failoverEpoch: the master term of
its broker name it last served or followed; a master adds epochStart, where its term began in
its CommitLog). Per broker name this registry keeps the current epoch, its master's address and
where each term began, in <registry store>/failover.json, so that a restarted registry still
knows an old master from the new one.

- A master registration of an older epoch, or of the current one from another address, is
  refused (demote=true) with where to go: the current master, a free brokerId (kept for it
  until it registers as a slave, so two old masters back at once get two), and the offset
  to cut the old master's CommitLog to, the start of the term after its own (what it wrote
  then was never replicated, so never acknowledged under replication=sync).
- A slave that followed an earlier term is answered with the start of the term after its own;
  it records the new epoch, or restarts to cut its CommitLog there if it holds more.
- Every second, a broker name whose master has been gone for failover_delay: unless the master
  still answers at its address (its connection to this registry dropped, or this registry
  restarted, and it has not registered again yet), of its live failover slaves the one with the
  largest CommitLog (GET_BROKER_RUNTIME_INFO) is told to become master at the next epoch
  (NOTIFY_BROKER_ROLE_CHANGED, 5.x's code).
- An operator's switchover (CONTROLLER_ELECT_MASTER, 5.x's electMaster): the live master is told
  to take no more sends (the same notice, naming its successor), the chosen slave is waited for
  until it holds the master's whole CommitLog, and is then promoted; the old master, refused at
  its next registration, comes back as a slave with nothing to cut. Nothing is lost, even under
  async replication. Should the slave not catch up in time, the master's next registration lifts
  its fence. With its master gone, the chosen slave is promoted as an election would.

Only one registry of a cluster may decide: two would elect on their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from smartgo.common.persist import PersistedFile
from smartgo.net.client import RemotingClient
from smartgo.net.codes import MASTER_ID, NO_OFFSET, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingError
from smartgo.registry import bodies
from smartgo.registry.route_info import RouteInfoManager

log = logging.getLogger(__name__)

STATE_FILE = "failover.json"
CALL_TIMEOUT = 3.0
SWITCH_POLL = 0.05              # s between looks at a switchover's master and slave
SWITCH_TIMEOUT = 10.0           # s for the chosen slave to hold all the fenced master wrote


class SwitchoverError(Exception):
    """A switchover that was refused or did not complete (nothing changed)."""


@dataclass(slots=True)
class Term:
    """A broker name's current master term, and where each term began in the CommitLog."""

    epoch: int = 0
    master: str = ""
    starts: dict[int, int] = field(default_factory=dict)
    acked: int = 0          # a live SYNC_MASTER's slave-acknowledged position, polled (memory only)


@dataclass(frozen=True, slots=True)
class Demotion:
    master: str
    epoch: int
    broker_id: int
    truncate_to: int

    def ext(self, ha_addr: str | None) -> dict[str, str]:
        return {"demote": "true", "masterAddr": self.master, "haServerAddr": ha_addr or "",
                "brokerId": str(self.broker_id), "failoverEpoch": str(self.epoch),
                "truncateOffset": str(self.truncate_to)}


def _parse_terms(raw: bytes) -> dict[str, Term]:
    return {name: Term(int(t["epoch"]), str(t["master"]), {int(e): int(o) for e, o in t["starts"].items()})
            for name, t in json.loads(raw).items()}


class FailoverController:
    def __init__(self, routes: RouteInfoManager, store_dir: Path, delay: float, *, unclean: bool = False,
                 clock: Callable[[], float] = time.monotonic, client: RemotingClient | None = None) -> None:
        self.routes = routes
        self.file = PersistedFile(Path(store_dir) / STATE_FILE)     # atomic, with a backup
        self.delay = delay
        self.unclean = unclean                     # promote a slave that lacks acknowledged messages too
        self.clock = clock
        self.client = client or RemotingClient()
        self.terms: dict[str, Term] = {}
        self.members: dict[str, str] = {}          # failover broker address -> its broker name
        self._absent: dict[str, float] = {}        # broker name -> when its master was first missed
        self._answering: set[str] = set()          # broker names whose missing master still answers (logged)
        self._short: set[str] = set()              # broker names whose slaves all lack acknowledged data (logged)
        self._promised: dict[str, dict[str, int]] = {}   # broker name -> demoted master -> its brokerId, until
                                                          # it registers as a slave (two at once get two ids)
        self._switching: set[str] = set()          # broker names in a switchover: their master stays fenced

    # -- state file -------------------------------------------------------------------------------
    def load(self) -> None:
        """The saved terms; a corrupt file (and backup) is logged, and returning masters are then
        judged by their epochs alone."""
        terms = self.file.load(_parse_terms, "failover state")
        if terms is not None:
            self.terms = terms
            log.info("failover state: %s", {n: (t.epoch, t.master) for n, t in terms.items()})

    def _save(self) -> None:
        self.file.save(json.dumps({name: {"epoch": t.epoch, "master": t.master,
                                          "starts": {str(e): o for e, o in t.starts.items()}}
                                   for name, t in self.terms.items()}).encode())

    # -- registrations ----------------------------------------------------------------------------
    def on_register(self, name: str, addr: str, broker_id: int, epoch: int, epoch_start: int) -> Demotion | None:
        """A failover broker registers: None to go on with the registration, or its demotion."""
        self.members[addr] = name
        promised = self._promised.setdefault(name, {})
        if broker_id != MASTER_ID:
            promised.pop(addr, None)
            return None
        term = self.terms.setdefault(name, Term())
        if epoch > term.epoch or (epoch == term.epoch and term.master in ("", addr)):
            changed = (term.epoch, term.master) != (epoch, addr)
            if changed:
                log.info("%s: master %s at epoch %d (was %s at %d)", name, addr, epoch, term.master or "-", term.epoch)
            term.epoch, term.master = epoch, addr
            if epoch_start != NO_OFFSET and epoch not in term.starts:
                term.starts[epoch] = epoch_start
                changed = True
            if changed:
                self._save()
            return None
        if addr not in promised:
            # the new master may still be registered at its slave id (it restarts to take the
            # role): that id is free, as 0 is the new master's
            broker = self.routes.broker_addr_table.get(name)
            held = broker.broker_addrs.items() if broker is not None else ()
            taken = {*(i for i, a in held if a != term.master), *promised.values()}
            promised[addr] = next(i for i in range(1, len(taken) + 2) if i not in taken)
        demotion = Demotion(term.master, term.epoch, promised[addr], term.starts.get(epoch + 1, NO_OFFSET))
        log.warning("%s: %s registers as master of epoch %d, but %s is master at epoch %d: sent back as slave %d "
                    "(CommitLog cut to %d)", name, addr, epoch, term.master, term.epoch, demotion.broker_id,
                    demotion.truncate_to)
        return demotion

    def rival(self, name: str, addr: str) -> str | None:
        """The failover master of name when addr, a broker without failover_enable, registers as its
        master: it must not take the route from the master this registry chose."""
        term = self.terms.get(name)
        return term.master if term is not None and term.master not in ("", addr) else None

    def answer(self, name: str, epoch: int) -> dict[str, str]:
        """What a failover broker's accepted registration is answered with: the current epoch, and
        for a slave that last followed an earlier term the offset its CommitLog must not pass, the
        start of the term after its own (a slave down at the election may hold more than the new
        master had: that part is the old master's alone). Only once that start is known."""
        term = self.terms.get(name)
        if term is None:
            return {"failoverEpoch": "0"}
        fields = {"failoverEpoch": str(term.epoch)}
        if name in self._switching:
            fields["switching"] = "true"            # the master keeps its fence
        if epoch < term.epoch:
            cut = term.starts.get(epoch + 1)
            if cut is None:
                fields["failoverEpoch"] = str(epoch)     # the new term's start is not known yet: ask again
            else:
                fields["truncateOffset"] = str(cut)
        return fields

    def ha_addr(self, addr: str) -> str | None:
        live = self.routes.broker_live_table.get(addr)
        return live.ha_server_addr if live else None

    # -- elections --------------------------------------------------------------------------------
    async def run(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check()
            except Exception:
                log.exception("failover check failed")

    async def check(self) -> None:
        """Promote a slave of every broker name whose master has been gone for `delay`."""
        now = self.clock()
        live = self.routes.broker_live_table
        self.members = {addr: name for addr, name in self.members.items() if addr in live}
        names = set(self.members.values())
        await asyncio.gather(*(self._poll_acked(name) for name in names))
        for name in names:
            broker = self.routes.broker_addr_table.get(name)
            if broker is None or MASTER_ID in broker.broker_addrs:
                self._absent.pop(name, None)
                self._short.discard(name)
                continue
            since = self._absent.setdefault(name, now)
            if now - since < self.delay:
                continue
            slaves = self._slaves(name)
            if slaves and not await self._master_answers(name):
                await self._elect(name, slaves)
                self._absent[name] = self.clock()    # give the new master failover_delay to register

    def _slaves(self, name: str) -> list[tuple[int, str]]:
        """(brokerId, address) of the live failover slaves the route of name lists."""
        broker = self.routes.broker_addr_table.get(name)
        return [(bid, addr) for bid, addr in (broker.broker_addrs.items() if broker is not None else ())
                if bid != MASTER_ID and self.members.get(addr) == name]

    async def _poll_acked(self, name: str) -> None:
        """What the live failover master of name has had acknowledged by a slave, if it is a
        SYNC_MASTER: an election must not lose it (5.x elects only from its SyncStateSet)."""
        term = self.terms.get(name)
        broker = self.routes.broker_addr_table.get(name)
        if term is None or broker is None or broker.broker_addrs.get(MASTER_ID) != term.master:
            return
        info = await self._runtime(term.master, quiet=True)
        if info is not None and info.get("brokerRole") == "SYNC_MASTER":
            try:
                term.acked = max(term.acked, int(info.get("slaveAckedOffset", "0")))
            except ValueError:
                pass

    async def _master_answers(self, name: str) -> bool:
        term = self.terms.get(name)
        if term is None or not term.master or await self._commitlog_end(term.master, quiet=True) is None:
            self._answering.discard(name)
            return False
        if name not in self._answering:
            self._answering.add(name)
            log.warning("%s: master %s is not registered but answers: no failover while it does", name, term.master)
        return True

    async def _ranked(self, slaves: list[tuple[int, str]]) -> list[tuple[int, int, str]]:
        """(CommitLog end, -brokerId, address) of the slaves that answer, the most advanced first
        (equal ends: the lowest brokerId)."""
        ends = await asyncio.gather(*(self._commitlog_end(addr) for _, addr in slaves))
        return sorted(((end, -bid, addr) for (bid, addr), end in zip(slaves, ends) if end is not None), reverse=True)

    async def _elect(self, name: str, slaves: list[tuple[int, str]]) -> str | None:
        """Promote the most advanced of slaves; None, or why none was."""
        ranked = await self._ranked(slaves)
        if not ranked:
            log.error("%s has no master, and none of its slaves answered", name)
            return "no slave answered"
        end, _, addr = ranked[0]
        term = self.terms.setdefault(name, Term())
        if end < term.acked and not self.unclean:
            if name not in self._short:
                self._short.add(name)
                log.error("%s has no master, and no slave that is up holds all it acknowledged (up to %d; the "
                          "most advanced, %s, ends at %d): waiting for one to come back (failover_unclean_enable "
                          "promotes it anyway)", name, term.acked, addr, end)
            return f"{addr} lacks what the master acknowledged (it ends at {end}, a slave had {term.acked})"
        return await self._promote(name, addr, f"master gone for {self.delay:g}s; promoted {addr} (CommitLog end "
                                   f"{end}) to master")

    async def _promote(self, name: str, addr: str, why: str, start: int = NO_OFFSET,
                       handover: str | None = None) -> str | None:
        """Make addr master of name at the next epoch (start: where that term begins, if known
        before the new master says; handover: the live old master, whose tables it copies last);
        None, or why it refused."""
        term = self.terms.setdefault(name, Term())
        before, epoch = (term.epoch, term.master), term.epoch + 1
        term.epoch, term.master = epoch, addr      # set first: an old master registering meanwhile is sent back
        try:
            refusal = await self._notify(addr, addr, epoch, handover)
        except RemotingError as exc:
            # It may have taken the role (its node restart can close the connection first): going
            # back could leave two masters. If it did not, no master registers, and an election follows.
            log.warning("%s: no answer from %s to its promotion (%s): epoch %d stays with it", name, addr, exc,
                        epoch)
            refusal = None
        if refusal is not None:
            log.error("%s: promoting %s %s", name, addr, refusal)
            if (term.epoch, term.master) == (epoch, addr):
                term.epoch, term.master = before
            return refusal
        if start != NO_OFFSET:
            term.starts[epoch] = start
        log.warning("%s: %s at epoch %d", name, why, epoch)
        self._save()
        return None

    async def _notify(self, to: str, master: str, epoch: int, handover: str | None = None) -> str | None:
        """NOTIFY_BROKER_ROLE_CHANGED to `to`: master is the master of epoch; None, or why it was
        refused (RemotingError: no answer)."""
        fields = {"masterAddress": master, "masterEpoch": str(epoch), "masterBrokerId": str(MASTER_ID)}
        if handover is not None:
            fields["syncFrom"] = handover
        response = await self.client.invoke(to, RemotingCommand(RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                                                ext_fields=fields), CALL_TIMEOUT)
        return None if response.code == ResponseCode.SUCCESS else f"refused: {response.remark}"

    # -- switchover -------------------------------------------------------------------------------
    async def switchover(self, name: str, target: str | None) -> Term:
        """CONTROLLER_ELECT_MASTER: make target, a live failover slave of name (None: the most
        advanced one), its master; its term."""
        broker = self.routes.broker_addr_table.get(name)
        if target is None:
            ranked = await self._ranked(self._slaves(name))
            if not ranked:
                raise SwitchoverError(f"{name} has no live failover slave that answers")
            target = ranked[0][2]
        slave_id = next((bid for bid, a in broker.broker_addrs.items() if a == target), None) if broker else None
        if slave_id is None or self.members.get(target) != name:
            raise SwitchoverError(f"{target} is not a live failover broker of {name}")
        if slave_id == MASTER_ID:
            raise SwitchoverError(f"{target} is the master of {name} already")
        if name in self._switching:
            raise SwitchoverError(f"a switchover of {name} is under way")
        master = broker.broker_addrs.get(MASTER_ID)  # type: ignore[union-attr]  # a slave_id was found in it
        self._switching.add(name)
        try:
            if master is None:
                refusal = await self._elect(name, [(slave_id, target)])
            else:
                end = await self._drain(name, master, target)
                refusal = await self._promote(name, target, f"switchover: promoted {target} (CommitLog end {end}, "
                                              f"all of {master}'s) to master", start=end, handover=master)
        finally:
            self._switching.discard(name)
        if refusal is not None:
            raise SwitchoverError(f"promoting {target} {refusal}")
        return self.terms[name]

    async def _drain(self, name: str, master: str, target: str) -> int:
        """Fence the master and wait until target holds all of its CommitLog; that end. The
        master's end counts once its commit actor refuses writes (failoverFencedEnd): a send that
        passed a net actor's fence check just before has landed by then, or is refused."""
        try:
            refusal = await self._notify(master, target, self.terms.setdefault(name, Term()).epoch + 1)
        except RemotingError as exc:
            refusal = f"failed: {exc}"
        if refusal is not None:
            raise SwitchoverError(f"asking {master} to stop taking sends {refusal}")
        log.info("%s: switchover to %s: %s takes no more sends", name, target, master)
        final = held = None
        for _ in range(round(SWITCH_TIMEOUT / SWITCH_POLL)):
            info, held = await asyncio.gather(self._runtime(master), self._commitlog_end(target))
            if info is None:
                raise SwitchoverError(f"{master} stopped answering")
            try:
                final = int(info.get("failoverFencedEnd", -1))
            except ValueError:
                raise SwitchoverError(f"{master} answered the CommitLog end {info['failoverFencedEnd']!r}") from None
            if final >= 0 and held is not None and held >= final:
                return held
            await asyncio.sleep(SWITCH_POLL)
        if final is None or final < 0:
            raise SwitchoverError(f"{master} did not stop writing within {SWITCH_TIMEOUT:g}s; it takes sends again")
        raise SwitchoverError(f"{target} did not catch up with {master} within {SWITCH_TIMEOUT:g}s (CommitLog "
                              f"ends {held} and {final}); {master} takes sends again")

    async def _commitlog_end(self, addr: str, quiet: bool = False) -> int | None:
        info = await self._runtime(addr, quiet)
        try:
            return int(info["commitLogMaxOffset"]) if info is not None else None
        except (KeyError, ValueError) as exc:
            log.warning("failover: no CommitLog end from %s: %r", addr, exc)
            return None

    async def _runtime(self, addr: str, quiet: bool = False) -> dict[str, str] | None:
        """The broker's GET_BROKER_RUNTIME_INFO table, or None (logged unless quiet)."""
        try:
            response = await self.client.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO),
                                                CALL_TIMEOUT)
            if response.code != ResponseCode.SUCCESS:
                raise RemotingError(f"code {response.code}: {response.remark}")
            table = bodies.load_json(response.body_bytes(), "runtime info")["table"]
            if not isinstance(table, dict):
                raise TypeError("runtime info's table is not an object")
            return table
        except (RemotingError, bodies.BodyError, KeyError, TypeError) as exc:
            if not quiet:
                log.warning("failover: no runtime info from %s: %s", addr, exc)
            return None

    async def close(self) -> None:
        await self.client.close()
