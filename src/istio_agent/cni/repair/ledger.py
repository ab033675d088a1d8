"""What the repair controller has done to which pod version, and when to try again (sans-IO, no clock).

Each broken pod is acted on once per resourceVersion: a pod seen again at a version already handled (a re-list,
a bookmark-free resend) is left alone, while a new version of a still-broken pod is judged again, as upstream's
reconciler does on every update. A failed action is retried with exponential backoff, at most `MAX_ATTEMPTS`
times per version (upstream's work queue gives up after 5 attempts too); the next version starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class Backoff:
    """Exponential delays, `first` doubling up to `cap` (seconds)."""

    first: float = 0.5
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1-based)."""
        return min(self.cap, self.first * 2 ** max(0, failures - 1))


@dataclass
class _Entry:
    uid: str
    handled: str = ""  # the resourceVersion acted on (or given up on)
    attempts: int = 0  # failures at `failing`
    failing: str = ""
    queued: bool = False


class Ledger:
    """Per pod (namespace, name): which version was handled, whether work is queued, failures so far."""

    def __init__(self, backoff: Backoff | None = None, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.backoff = backoff or Backoff()
        self.max_attempts = max_attempts
        self._entries: dict[tuple[str, str], _Entry] = {}

    def _entry(self, key: tuple[str, str], uid: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None or entry.uid != uid:  # a new pod under an old name starts afresh
            entry = self._entries[key] = _Entry(uid)
        return entry

    def wants(self, key: tuple[str, str], uid: str, version: str) -> bool:
        """A broken pod was seen at `version`: True when it should be queued now (not handled, not queued)."""
        entry = self._entry(key, uid)
        if entry.handled == version or entry.queued:
            return False
        entry.queued = True
        return True

    def due(self, key: tuple[str, str], uid: str, version: str) -> bool:
        """The worker took `key` with the pod now at `version`: act unless that version was handled."""
        entry = self._entry(key, uid)
        entry.queued = False
        return entry.handled != version

    def done(self, key: tuple[str, str], uid: str, version: str) -> None:
        """Acted (or decided to skip) at `version`."""
        entry = self._entry(key, uid)
        entry.handled, entry.attempts, entry.failing = version, 0, ""

    def failed(self, key: tuple[str, str], uid: str, version: str) -> float | None:
        """An action at `version` failed: seconds until the retry, or None once attempts are used up."""
        entry = self._entry(key, uid)
        entry.attempts = entry.attempts + 1 if entry.failing == version else 1
        entry.failing = version
        if entry.attempts >= self.max_attempts:
            entry.handled = version  # given up until the pod changes
            return None
        entry.queued = True
        return self.backoff.delay(entry.attempts)

    def settled(self, key: tuple[str, str]) -> None:
        """The pod is no longer broken: nothing queued for it stays wanted."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.queued = False

    def forget(self, key: tuple[str, str]) -> None:
        """The pod is gone."""
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
