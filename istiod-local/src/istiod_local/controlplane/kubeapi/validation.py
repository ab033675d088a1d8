"""The apiserver's metadata checks for labels and annotations, in its own words (pure).

A label key or an annotation key is a qualified name: an optional DNS-1123
subdomain prefix (at most 253 characters) and `/`, then a name part of at
most 63 characters, alphanumeric at both ends with `-`, `_` or `.` between
(annotation keys are checked lower-cased, so their case does not matter). A
label value is empty or such a name part (at most 63 characters). All
annotation keys and values together may hold at most 256 KiB.

Each failed rule is one `FieldError`; the 422 Status joins them as the
apiserver does (`Pod "x" is invalid: metadata.labels: Invalid value: ...`,
several in brackets, comma-separated) and lists each as a cause.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                      "alphanumeric character")
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_FMT = f"({QUALIFIED_NAME_FMT})?"
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character")
LABEL_VALUE_MAX = 63
DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = f"{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*"
DNS1123_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
                         "or '.', and must start and end with an alphanumeric character")
DNS1123_SUBDOMAIN_MAX = 253
ANNOTATIONS_MAX_BYTES = 256 * 1024

_QUALIFIED_NAME = re.compile(f"^{QUALIFIED_NAME_FMT}$")
_LABEL_VALUE = re.compile(f"^{LABEL_VALUE_FMT}$")
_DNS1123_SUBDOMAIN = re.compile(f"^{DNS1123_SUBDOMAIN_FMT}$")


@dataclass(frozen=True)
class FieldError:
    """One failed rule: the field path, the cause's reason, and the text after `<field>: `."""

    field: str
    reason: str  # FieldValueInvalid | FieldValueTooLong
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.body, "field": self.field}


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len(limit: int) -> str:
    return f"must be no more than {limit} characters"


def _subdomain(value: str) -> list[str]:
    out = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        out.append(_max_len(DNS1123_SUBDOMAIN_MAX))
    if not _DNS1123_SUBDOMAIN.match(value):
        out.append(_regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, "example.com"))
    return out


def qualified_name(value: str) -> list[str]:
    """What is wrong with a label or annotation key (nothing: an empty list)."""
    parts = value.split("/")
    out: list[str] = []
    name_rule = _regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
    if len(parts) > 2:
        return [f"a qualified name {name_rule} with an optional DNS subdomain prefix and '/' "
                "(e.g. 'example.com/MyName')"]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            out.append("prefix part must be non-empty")
        else:
            out += [f"prefix part {msg}" for msg in _subdomain(prefix)]
    if not name:
        out.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        out.append(f"name part {_max_len(QUALIFIED_NAME_MAX)}")
    if not _QUALIFIED_NAME.match(name):
        out.append(f"name part {name_rule}")
    return out


def label_value(value: str) -> list[str]:
    out = []
    if len(value) > LABEL_VALUE_MAX:
        out.append(_max_len(LABEL_VALUE_MAX))
    if not _LABEL_VALUE.match(value):
        out.append(_regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return out


def _invalid(field: str, value: str, message: str) -> FieldError:
    return FieldError(field, "FieldValueInvalid", f"Invalid value: {json.dumps(value, ensure_ascii=False)}: {message}")


def check_labels(values: Mapping[str, str], field: str = "metadata.labels") -> list[FieldError]:
    out = []
    for key, value in values.items():
        out += [_invalid(field, key, msg) for msg in qualified_name(key)]
        out += [_invalid(field, value, msg) for msg in label_value(value)]
    return out


def check_annotations(values: Mapping[str, str], field: str = "metadata.annotations") -> list[FieldError]:
    out = [_invalid(field, key, msg) for key in values for msg in qualified_name(key.lower())]
    size = sum(len(k.encode()) + len(v.encode()) for k, v in values.items())
    if size > ANNOTATIONS_MAX_BYTES:
        out.append(FieldError(field, "FieldValueTooLong", f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} "
                                                          "bytes"))
    return out


def aggregate(found: list[FieldError]) -> str:
    """The errors as the apiserver joins them into a Status message."""
    if len(found) == 1:
        return str(found[0])
    return "[" + ", ".join(str(e) for e in found) + "]"
