"""Secret diagnostics: the agent's and Envoy's secrets in istioctl's SecretItem shape, and their diff.

`istioctl proxy-config secret` summarises Envoy's SDS secrets as SecretItems
(name, certificate, state, validity, serial, dates); `pilot-agent secrets`
prints the same from the local Envoy, and with `--diff` compares them with the
agent's own cache, served here on `/debug/secrets` (localhost only: it lists
certificates, never keys). A rotated certificate that Envoy has not taken shows
up as two items for one name, one held only by the agent and one only by Envoy.

All of it is pure (`now` is passed in) except `add_secrets_debug_route`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cryptography import x509

from istio_agent.protos import typeurls

if TYPE_CHECKING:
    from istio_agent.httpio.routing import Router
    from istio_agent.httpio.server_core import Request, Response
    from istio_agent.security.cache import SecretCache
    from istio_agent.security.core.secrets import SecretItem

DEBUG_SECRETS_PATH = "/debug/secrets"
CONFIG_DUMP_SECRETS_PATH = "/config_dump?mask=dynamic_active_secrets,dynamic_warming_secrets"
ACTIVE, WARMING, UNINITIALIZED = "ACTIVE", "WARMING", "UNINITIALIZED"
PRESENT = "PRESENT"
ITEM_COLUMNS = ("RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE")
DIFF_COLUMNS = ("RESOURCE NAME", "TYPE", "VALID CERT", "NODE AGENT", "PROXY", "SERIAL NUMBER", "NOT AFTER",
                "NOT BEFORE")


@dataclass(frozen=True)
class SecretView:
    """istioctl's SecretItem; field order is the JSON key order."""

    resource_name: str
    cert: str = ""
    source: str = ""
    destination: str = ""
    state: str = ""
    trust_domain: str = ""
    cert_valid: bool = False
    serial_number: str = ""
    not_after: str = ""
    not_before: str = ""
    type: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SecretView:
        if not isinstance(obj, Mapping) or not isinstance(obj.get("resource_name"), str):
            raise ValueError(f"not a secret item: {str(obj)[:120]}")
        known = {k: obj[k] for k in cls.__dataclass_fields__ if k in obj}
        return cls(**known)

    @property
    def key(self) -> tuple[str, str]:
        """Two sides hold the same secret when name and certificate bytes agree (upstream compares the data)."""
        return self.resource_name, self.cert


@dataclass(frozen=True)
class SecretDiff:
    """istioctl's SecretItemDiff: `agent` is PRESENT when the agent holds it, `proxy` is Envoy's state for it."""

    agent: str
    proxy: str
    item: SecretView

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "proxy": self.proxy, **self.item.to_json()}

    @property
    def in_sync(self) -> bool:
        return self.agent == PRESENT and self.proxy == ACTIVE


def _rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(name: str, data: str, state: str, now: float, source: str = "", destination: str = "",
             trust_domain: str = "") -> SecretView:
    """A SecretView from PEM data; the first certificate gives type, serial (hex), dates and validity at `now`."""
    view = SecretView(resource_name=name, cert=data, source=source, destination=destination, state=state,
                      trust_domain=trust_domain)
    if not data:
        return view
    try:
        cert = x509.load_pem_x509_certificate(data.encode())
        after, before = cert.not_valid_after_utc, cert.not_valid_before_utc
    except ValueError:
        return view
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    except ValueError:
        return view
    return SecretView(
        resource_name=name, cert=data, source=source, destination=destination, state=state,
        trust_domain=trust_domain, cert_valid=before.timestamp() <= now <= after.timestamp(),
        serial_number=format(cert.serial_number, "x"), not_after=_rfc3339(after), not_before=_rfc3339(before),
        type="CA" if is_ca else "Cert Chain",
    )


def agent_views(items: Iterable[SecretItem], now: float) -> list[SecretView]:
    """The agent's cache (SecretCache.snapshot()) as SecretViews: the chain, or the bundle for roots."""
    views = []
    for item in items:
        data = (item.root_cert if item.is_root else item.cert_chain).decode("utf-8", "replace")
        views.append(describe(item.resource_name, data, ACTIVE, now, source=item.source))
    return views


# ---- Envoy's config dump ---------------------------------------------------------------------------------


def _data_source(source: Any) -> str:
    """A DataSource from a JSON config dump (inline bytes are base64); file sources show as empty."""
    if not isinstance(source, Mapping):
        return ""
    if "inline_bytes" in source:
        try:
            return base64.b64decode(source["inline_bytes"], validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError, TypeError):
            raise ValueError("inline_bytes is not base64") from None
    value = source.get("inline_string", "")
    return value if isinstance(value, str) else ""


def _secret_views(entry: Mapping[str, Any], state: str, now: float) -> list[SecretView]:
    name = entry.get("name", "")
    if not isinstance(name, str):
        raise ValueError("secret without a name")
    if state == ACTIVE and entry.get("version_info") == "uninitialized":
        state = UNINITIALIZED  # Envoy could not use what it was sent
    secret = entry.get("secret") or {}
    if not isinstance(secret, Mapping):
        raise ValueError(f"secret {name}: not an object")
    chain = _data_source((secret.get("tls_certificate") or {}).get("certificate_chain"))
    if chain:
        return [describe(name, chain, state, now)]
    context = secret.get("validation_context") or {}
    trusted = _data_source(context.get("trusted_ca"))
    if trusted:
        return [describe(name, trusted, state, now)]
    validator = (context.get("custom_validator_config") or {}).get("typed_config") or {}
    domains = validator.get("trust_domains") or []
    views = [describe(name, _data_source(d.get("trust_bundle")), state, now, trust_domain=str(d.get("name", "")))
             for d in domains if isinstance(d, Mapping)]
    return views or [describe(name, "", state, now)]


def proxy_views(dump: Mapping[str, Any], now: float) -> list[SecretView]:
    """Envoy's dynamic secrets (warming first, then active, in Envoy's order); ValueError on a malformed dump."""
    if not isinstance(dump, Mapping) or not isinstance(dump.get("configs", []), list):
        raise ValueError("not an Envoy config dump")
    views: list[SecretView] = []
    for config in dump.get("configs", []):
        if not isinstance(config, Mapping) or config.get("@type") != typeurls.SECRETS_CONFIG_DUMP:
            continue
        for key, state in (("dynamic_warming_secrets", WARMING), ("dynamic_active_secrets", ACTIVE)):
            for entry in config.get(key) or []:
                if not isinstance(entry, Mapping):
                    raise ValueError(f"{key}: entry is not an object")
                views += _secret_views(entry, state, now)
    return views


# ---- the diff ----------------------------------------------------------------------------------------------


def diff_secrets(agent: Iterable[SecretView], proxy: Iterable[SecretView]) -> list[SecretDiff]:
    """Match the two sides by name and certificate; what only one side holds stays a diff item of its own."""
    by_key: dict[tuple[str, str], SecretDiff] = {}
    order: list[tuple[str, str]] = []
    for view in proxy:
        if view.key not in by_key:
            order.append(view.key)
        by_key[view.key] = SecretDiff(agent="", proxy=view.state, item=view)
    for view in agent:
        match = by_key.get(view.key)
        if match is not None:
            item = SecretView(**{**match.item.to_json(), "source": view.source})
            by_key[view.key] = SecretDiff(agent=PRESENT, proxy=match.proxy, item=item)
        else:
            order.append(view.key)
            by_key[view.key] = SecretDiff(agent=PRESENT, proxy="", item=view)
    diffs = [by_key[k] for k in order]
    return sorted(diffs, key=lambda d: (d.item.resource_name, d.proxy == "", d.agent == ""))


def disagreements(diffs: Iterable[SecretDiff]) -> list[str]:
    """One line per secret the two sides do not both hold active; empty when they agree."""
    lines = []
    for diff in diffs:
        if diff.in_sync:
            continue
        item = diff.item
        serial = item.serial_number or "(no certificate)"
        if diff.agent != PRESENT:
            lines.append(f"{item.resource_name}: Envoy holds serial {serial} ({diff.proxy}), the agent does not")
        elif not diff.proxy:
            lines.append(f"{item.resource_name}: the agent holds serial {serial}, Envoy does not")
        else:
            lines.append(f"{item.resource_name}: serial {serial} is {diff.proxy} in Envoy, not ACTIVE")
    return lines


# ---- output -------------------------------------------------------------------------------------------------


def tabulate(rows: list[list[str]], padding: int = 5) -> str:
    """Go's tabwriter as istioctl sets it up (cell width + 5 spaces; the last column unpadded), lines trimmed."""
    widths = [max(len(row[i]) for row in rows) + padding for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        line = "".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + row[-1]
        out.append(line.rstrip())
    return "\n".join(out) + "\n"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def render_items(views: list[SecretView]) -> str:
    """The `istioctl proxy-config secret` table; TRUST DOMAIN appears only when some secret has one."""
    if not views:
        return "No secret items to show.\n"
    with_domain = any(v.trust_domain for v in views)
    header = [*ITEM_COLUMNS, *(["TRUST DOMAIN"] if with_domain else [])]
    rows = [header]
    for v in views:
        rows.append([v.resource_name, v.type, v.state, _bool(v.cert_valid), v.serial_number, v.not_after,
                     v.not_before, *([v.trust_domain] if with_domain else [])])
    return tabulate(rows)


def render_diffs(diffs: list[SecretDiff]) -> str:
    if not diffs:
        return "No secrets found to diff.\n"
    rows = [list(DIFF_COLUMNS)]
    for d in diffs:
        v = d.item
        rows.append([v.resource_name, v.type, _bool(v.cert_valid), d.agent, d.proxy, v.serial_number, v.not_after,
                     v.not_before])
    return tabulate(rows)


def to_json_text(objects: Iterable[SecretView | SecretDiff]) -> str:
    """Indented like istioctl's `json.MarshalIndent(..., "", " ")`."""
    return json.dumps([o.to_json() for o in objects], indent=1)


# ---- the agent's endpoint ------------------------------------------------------------------------------------


def add_secrets_debug_route(app: Router, cache: SecretCache, clock: Callable[[], float] = time.time) -> None:
    """GET /debug/secrets on the status server: the agent's cache as SecretItems, for localhost only."""
    from istio_agent.httpio.server_core import json_response, text_response
    from istio_agent.netaddr import is_localhost

    async def handle(request: Request) -> Response:
        if not is_localhost(request.remote):
            return text_response(403, "only requests from localhost are allowed")
        return json_response(200, to_json_text(agent_views(cache.snapshot(), clock())))

    app.add_get(DEBUG_SECRETS_PATH, handle)
