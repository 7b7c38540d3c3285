"""The run's deadline, which every wait and request timeout fits inside, and its log line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def log(message: str) -> None:
    """One line of the journal (systemd keeps the unit's stdout)."""
    print(f"autodown: {message}", flush=True)


@dataclass
class Deadline:
    """The end of this run: every wait and request timeout fits inside it."""

    clock: Clock
    end: float

    def left(self) -> float:
        return self.end - self.clock()

    def timeout(self, ceiling: float) -> float | None:
        """A request timeout within the deadline; None when too little time is left to try."""
        left = self.left()
        return min(ceiling, left) if left >= 1 else None
