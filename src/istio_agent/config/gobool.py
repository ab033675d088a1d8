"""Booleans as Go's strconv.ParseBool reads them, which is how upstream parses every boolean flag and variable.

Standard library only and nothing else imported, so the per-pod CLIs (istio-iptables,
the CNI plugin) can use it without paying for the configuration machinery.
"""

TRUE_SPELLINGS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE_SPELLINGS = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """1/t/T/TRUE/true/True and 0/f/F/FALSE/false/False, nothing else (ValueError)."""
    if text in TRUE_SPELLINGS:
        return True
    if text in FALSE_SPELLINGS:
        return False
    raise ValueError(f"not a boolean (expected true or false): {text!r}")


def is_true(value: object) -> bool:
    """True only for a true spelling (how StringBool metadata reads); anything else, invalid too, is false."""
    try:
        return parse_bool(str(value))
    except ValueError:
        return False
