"""A judge key revoked mid-run, for the loopback judge server: a :class:`FaultScript` that answers
until the key is revoked -- after a number of requests, or when a test says so -- and then answers
every request with 401, as a provider does once a key is withdrawn."""

from __future__ import annotations

from balcaprl.testing.judge_server import FaultScript


class RevokedKey(FaultScript):
    """``RevokedKey(after=N)``: the first N requests are answered, the rest get 401. ``after=None``:
    answered until :meth:`revoke` is called (e.g. from a trainer callback after a step)."""

    def __init__(self, after: int | None = None):
        super().__init__()
        self.answered = 0
        self.after = after
        self.revoked = after == 0

    def revoke(self) -> None:
        with self._lock:
            self.revoked = True

    def next_fault(self, text: str) -> str:
        with self._lock:
            if not self.revoked and self.after is not None and self.answered >= self.after:
                self.revoked = True
            if self.revoked:
                return "unauthorized"
            self.answered += 1
            return "ok"
