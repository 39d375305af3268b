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


ENGINE_LEASE_S = 10.0  # --placement-engines shared: an engine silent for longer is gone (its gangs go back)
ENGINE_MODES = ("leader", "shared")  # --placement-engines


class Engines:
    """The placement engines that act at once (--placement-engines shared), each under the id it sends. An engine
    is heard from at every call; one silent for `lease_s`, and in no call now (a long poll counts as heard from
    until it ends), is gone: `gone` names it once, and the caller takes back what it was placing. An engine that
    asks again after that (it was paused, or a round outlasted the lease) is simply a live one again: whatever it
    answers for gangs that are no longer its own is refused gang by gang, by the caller. Pure: the clock passed
    in."""

    def __init__(self, lease_s: float = ENGINE_LEASE_S) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s: must be more than 0, got {lease_s}")
        self.lease_s = lease_s
        self._seen: dict[str, float] = {}  # id -> when it was last heard from
        self._calls: dict[str, int] = {}  # id -> its calls in progress (long polls)

    def __contains__(self, engine: str) -> bool:
        return engine in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def heard(self, engine: str, now: float) -> bool:
        """`engine` called; True when it is new (or back after it was gone)."""
        new = engine not in self._seen
        self._seen[engine] = now
        return new

    def begin(self, engine: str, now: float) -> bool:
        """A call of `engine` begins (it is not gone while it lasts); True when the engine is new."""
        self._calls[engine] = self._calls.get(engine, 0) + 1
        return self.heard(engine, now)

    def end(self, engine: str, now: float) -> None:
        n = self._calls.get(engine, 0) - 1
        if n > 0:
            self._calls[engine] = n
        else:
            self._calls.pop(engine, None)
        if engine in self._seen:
            self._seen[engine] = now

    def gone(self, now: float) -> list[str]:
        """The engines silent for longer than the lease and in no call, forgotten now (each named once)."""
        out = [e for e, t in self._seen.items() if now - t > self.lease_s and not self._calls.get(e)]
        for e in out:
            del self._seen[e]
        return out


def orphan_release(state: str | None, owner: str, engine: str) -> str:
    """Which engine may release an orphaned claim (a gang attempt's claim in the host manager that nobody will
    launch), when several engines act at once: "give" it to `engine` now, "keep" it for later, or "drop" it.
    `state` is the resource manager's entry of that same gang attempt (None: none), `owner` the engine placing
    it. A claim is one slot per gang attempt in the host manager, and the release must come before any claim of
    that attempt again, from the same engine: else an engine's release could free another's fresh claim of it.
    So the claim of a gang attempt waiting to be placed again is kept until an engine takes the gang (and released
    by that engine, before it claims), and one of a gang attempt placed since is dropped (its new claim succeeded,
    so the old one was gone already)."""
    if state is None:
        return "give"  # nobody will claim that attempt again
    if state == "placing":
        return "give" if owner == engine else "keep"
    if state in ("ready", "handed"):
        return "drop"
    return "keep"  # waiting
