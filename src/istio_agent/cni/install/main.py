"""`install-cni` entry point (being written)."""

import sys


def main() -> None:
    sys.exit("install-cni: not built yet")
