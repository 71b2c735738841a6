"""The commit actor: the commit stage (smartgo.broker.commit_stage) in a process of its own.

A node with several net actors runs it (or one with commit_in_net = false): every net actor and
the schedule actor hand it their records through send.<name> rings and get completions back
through done.<name>. With one net actor the stage runs inside that net actor instead.
"""

from __future__ import annotations

import asyncio

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.ring import wait_any
from smartgo.broker import profiling
from smartgo.broker.commit_stage import CommitStage


class CommitActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets

    async def start(self) -> None:
        self._profile = profiling.start(self.name)
        self.stage = CommitStage(self, self.nets)
        self._task = self.spawn(self._run(), "loop")

    async def _run(self) -> None:
        stage = self.stage
        while True:
            if stage.turn():
                await asyncio.sleep(0)      # let the heartbeat and control messages in between batches
            else:                           # the broker actor rings when the fence moves
                await wait_any(stage.inputs, self.bell, 1.0, ready=stage.fence_moved)

    async def stop(self) -> None:
        # The net actors stopped first and waited for their answers (the loop was cancelled before stop()).
        self.stage.close()
        profiling.dump(self._profile, self.name)
