"""The actor runtime: actor processes, shared-memory rings, the board, the supervisor.

What the broker's actors use:
    Actor, ActorContext            smartgo.actors.actor        (hooks: start, stop, on_control, every)
    ActorSpec                      smartgo.actors.spec         (one actor of a role)
    Role                           smartgo.actors.role         (role -> actors, board fields, recovery;
                                                               the roles themselves: smartgo.node.roles)
    Ring, Doorbell, wait_any       smartgo.actors.ring         (SPSC byte rings)
    Board, FieldSpec               smartgo.actors.board        (published positions, flags, queue table)
    node_health                    smartgo.actors.health       (what `smartgo health` shows)
"""

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.board import Board, FieldSpec
from smartgo.actors.ring import CONSUMER, PRODUCER, Doorbell, Ring, RingTimeout, wait_any
from smartgo.actors.spec import ActorSpec

__all__ = ["Actor", "ActorContext", "ActorSpec", "Board", "FieldSpec", "Ring", "Doorbell", "RingTimeout",
           "wait_any", "PRODUCER", "CONSUMER"]
