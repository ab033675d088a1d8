"""The first workload key, made on a thread while the agent is still loading.

Upstream's agent is a Go binary that asks for its first certificate within
milliseconds of starting. This one first imports its modules and resolves its
options (~150-250 ms), and only then would the secret cache make a key: an RSA
key costs another 40-100 ms (the prime search varies). cryptography releases
the GIL while it generates an RSA key, so a thread started as soon as the key's
parameters are known (the CLI reads them from the environment before the
agent's imports) makes the key while the main thread imports: by the time the
cache asks, the key is usually there (bench_identity's time to first
certificate).

The rules that keep this safe:
- the cache takes the key only if it is of the kind the resolved options ask
  for (`KeySpec.of`); the early guess never decides anything, a wrong guess only
  costs its head start;
- a key is handed out at most once: the first request takes it (or discards it
  on a mismatch), and every later one, a retry after a failed first request and
  every rotation, makes its own, as upstream makes a new key for every CSR;
- the thread is a daemon: an agent told to stop during a long key generation
  exits without waiting for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from istio_agent.pki.keys import KeyAlgorithm, PrivateKey
    from istio_agent.security.options import SecurityOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeySpec:
    """The kind of key to make: RSA of `rsa_bits`, or ECDSA on `curve` (the other field is not part of it)."""

    algorithm: KeyAlgorithm
    rsa_bits: int = 0
    curve: str = ""

    @classmethod
    def rsa(cls, bits: int) -> KeySpec:
        return cls("RSA", rsa_bits=bits)

    @classmethod
    def ecdsa(cls, curve: str) -> KeySpec:
        return cls("ECDSA", curve=curve.upper())

    @classmethod
    def of(cls, options: SecurityOptions) -> KeySpec:
        """The key the resolved options ask for."""
        if options.key_algorithm == "ECDSA":
            return cls.ecdsa(options.ecc_curve)
        return cls.rsa(options.rsa_key_size)

    def generate(self) -> PrivateKey:
        from istio_agent.pki import keys

        if self.algorithm == "ECDSA":
            return keys.generate_key("ECDSA", curve=self.curve)
        return keys.generate_key("RSA", rsa_bits=self.rsa_bits)


class KeyAhead:
    """One key of `spec`, made by `run()` (on a daemon thread after `start()`), handed out by `take()` once."""

    def __init__(self, spec: KeySpec, generate: Callable[[KeySpec], PrivateKey] | None = None) -> None:
        self.spec = spec
        self._generate = generate or KeySpec.generate
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._key: PrivateKey | None = None
        self._claimed = False

    def start(self) -> KeyAhead:
        """Make the key on a daemon thread from now on."""
        threading.Thread(target=self.run, name="workload-key-ahead", daemon=True).start()
        return self

    def run(self) -> None:
        """Make the key (the thread's body). A failure leaves no key: the cache then makes its own and reports."""
        try:
            self._key = self._generate(self.spec)
        except Exception as exc:
            log.debug("making the first workload key ahead failed (the first request makes its own): %s", exc)
        finally:
            self._done.set()

    @property
    def claimed(self) -> bool:
        """True once `take()` was called: the key is gone, whether it was used or discarded."""
        return self._claimed

    def take(self, spec: KeySpec) -> PrivateKey | None:
        """The key, if it is of `spec` and nobody took it before; None otherwise.

        Blocks until the key is made: call it off the event loop (the cache's key job runs on its own thread).
        The first call claims the key even on a mismatch, so a key never serves two certificates.
        """
        with self._lock:
            if self._claimed:
                return None
            self._claimed = True
        if spec != self.spec:
            log.debug("the key made ahead (%s) is not the one the options ask for (%s): discarded", self.spec, spec)
            return None
        self._done.wait()
        key, self._key = self._key, None
        return key
