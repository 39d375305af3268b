"""Which caller of a kind is the current one: the placement engine that asks for gangs, the job manager that takes
placements. Pure (plain data, no lock: the resource manager's shell calls it under its one lock).
"""

from __future__ import annotations

MAX_RETIRED = 64  # ids of replaced placement engines / job managers remembered (their late calls are refused)


class Current:
    """Which caller of a kind (the placement engine, the job manager) is the current one, by the id it sends. A
    new id replaces the current one for good: the replaced id is retired, and any later call from it (a long
    poll of a process that died mid-call, a process that was paused) is answered with nothing, so that nothing
    is handed to a caller that will never act on it."""

    def __init__(self) -> None:
        self.id = ""
        self._retired: dict[str, None] = {}

    def asks(self, caller: str) -> tuple[bool, str]:
        """(whether `caller` may be answered, the id it replaced: "" when none)."""
        if not caller or caller == self.id:
            return True, ""
        if caller in self._retired:
            return False, ""
        replaced, self.id = self.id, caller
        if replaced:
            self._retired[replaced] = None
            while len(self._retired) > MAX_RETIRED:
                del self._retired[next(iter(self._retired))]
        return True, replaced

    def superseded(self, caller: str) -> bool:
        return bool(caller) and caller != self.id
