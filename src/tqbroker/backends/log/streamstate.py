"""What a stream keeps besides its records, in ``stream.cbor`` (``docs/storage-format.md``).

Responsibilities: the stored positions, by name (``offsets`` by consumer tag: server-side
offset tracking; ``group_offsets`` by consumer group: the group's committed offset), the
idempotent producers' states (``producers``: epoch and next sequence, by producer id), each
update saying whether it changed anything (the stream's next flush then writes the file);
clamping the positions when the log is cut back; the file's encoding (with the recovery point)
and its decoding (anything unreadable: nothing stored; a producer stored as a bare sequence,
before producer epochs: epoch 0).
"""

from __future__ import annotations

from typing import Any

import cbor2

from ..streams import ProducerState

STATE_FILE = "stream.cbor"


class StreamState:
    def __init__(self, value: object = None) -> None:
        """The state decoded from ``stream.cbor``'s map (anything else: empty)."""
        state: dict[Any, Any] = value if isinstance(value, dict) else {}
        self.recovery_point = int(state.get("recovery_point", 0))
        self.offsets = _positions(state.get("offsets"))
        self.group_offsets = _positions(state.get("groups"))
        self.producers = _producer_states(state.get("producers"))

    def store_offset(self, consumer_tag: str, offset: int) -> bool:
        return _remember(self.offsets, consumer_tag, offset)

    def commit_group_offset(self, group: str, offset: int) -> bool:
        return _remember(self.group_offsets, group, offset)

    def record_producer(self, producer: str, epoch: int, sequence: int) -> bool:
        state = ProducerState(epoch, sequence)
        if self.producers.get(producer) == state:
            return False
        self.producers[producer] = state
        return True

    def clamp(self, end: int) -> None:
        """The log was cut back to ``end``: no position is past it (producer states stay)."""
        for table in (self.offsets, self.group_offsets):
            for name, position in table.items():
                table[name] = min(position, end)

    def encode(self, recovery_point: int) -> bytes:
        """``stream.cbor``'s bytes, as of now."""
        return cbor2.dumps(
            {
                "recovery_point": recovery_point,
                "offsets": dict(self.offsets),
                "groups": dict(self.group_offsets),
                "producers": {
                    name: [state.epoch, state.next_sequence]
                    for name, state in self.producers.items()
                },
            }
        )


def _remember(table: dict[str, int], name: str, value: int) -> bool:
    if table.get(name) == value:
        return False
    table[name] = value
    return True


def _producer_states(value: object) -> dict[str, ProducerState]:
    """``[epoch, next_sequence]`` by producer id, or (stored before producer epochs) the next
    sequence alone: epoch 0."""
    if not isinstance(value, dict):
        return {}
    states = {}
    for name, stored in value.items():
        if isinstance(stored, list) and len(stored) == 2:
            states[str(name)] = ProducerState(int(stored[0]), int(stored[1]))
        elif isinstance(stored, int):
            states[str(name)] = ProducerState(0, stored)
    return states


def _positions(value: object) -> dict[str, int]:
    """Stored positions by name (anything else: none)."""
    if not isinstance(value, dict):
        return {}
    return {str(name): int(offset) for name, offset in value.items()}
