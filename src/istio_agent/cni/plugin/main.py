"""`istio-cni` entry point (being written)."""

import sys


def main() -> None:
    sys.exit("istio-cni: not built yet")
