"""libc functions of this process by name, called through the `_ctypes` extension directly.

Not the `ctypes` package: its import costs ~2.5 ms (istio-iptables runs once per pod) and, with
`ctypes.util.find_library`, ~0.4 MB in every agent. Arguments and results are C ints. Imports nothing
at module level, so the lean istio-iptables path can carry it.
"""

from __future__ import annotations

_RTLD_NOW = 2


def function(name: str) -> int:
    """The address of `name` among this process's symbols (OSError when there is none: malloc_trim off glibc)."""
    import _ctypes

    return int(_ctypes.dlsym(_ctypes.dlopen(None, _RTLD_NOW), name))  # type: ignore[arg-type]  # NULL: this process


def call(address: int, *args: int) -> int:
    """Call the C function at `address` with int arguments; its int result."""
    import _ctypes

    return int(_ctypes.call_function(address, args))  # type: ignore[attr-defined]
