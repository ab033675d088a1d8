"""The agent's environment-variable reference, generated from the registry (`python -m istio_agent.config.envtable`).

`docs/ENVIRONMENT.md` is this module's output, checked by a test, so the table
can never drift from what the agent actually reads and honours. The other
programs' variables are on their reference pages (`config/reference.py`,
`docs/reference/`), whose cells it shares.
"""

from __future__ import annotations

import sys
from pathlib import Path

from istio_agent.config import env
from istio_agent.config.envvar import ACCEPTED, HONOURED, PARTIAL
from istio_agent.config.reference import cell, default_text

DOC_PATH = Path("docs/ENVIRONMENT.md")
_PREFIXES = (
    (env.ISTIO_META_PREFIX, "each becomes node metadata key `X` (honoured)"),
    (env.ISTIO_METAJSON_PREFIX, "each JSON object is merged into node metadata (honoured)"),
    (env.XDS_HEADER_PREFIX, "each is sent to istiod as header `X` (honoured)"),
    (env.CA_HEADER_PREFIX, "each is sent to the CA as header `X` (honoured)"),
)


def render_markdown() -> str:
    variables = sorted(env.REGISTRY.values(), key=lambda v: v.name)
    upstream = [v for v in variables if v.upstream]
    count = {level: sum(1 for v in upstream if v.support == level) for level in (HONOURED, PARTIAL, ACCEPTED)}
    lines = [
        "# Environment variables",
        "",
        "Generated from `src/istio_agent/config/env.py` by `python -m istio_agent.config.envtable`"
        " (`make docs`); a test keeps it in sync.",
        "",
        f"Of {len(upstream)} variables upstream's agent reads, {count[HONOURED]} are honoured,"
        f" {count[PARTIAL]} partly honoured and {count[ACCEPTED]} only accepted;"
        f" {len(variables) - len(upstream)} more are this project's own (\"Not upstream\").",
        "`pilot-agent` warns at start about every variable that is set but only accepted.",
        "",
        "| Variable | Type | Default | Support | Meaning | What is missing |",
        "|---|---|---|---|---|---|",
    ]
    for var in variables:
        support = var.support if var.upstream else f"{var.support} (not upstream)"
        lines.append(f"| `{var.name}` | {var.type_name} | {cell(default_text(var))} | {support} |"
                     f" {cell(var.description)} | {cell(var.note)} |")
    lines += ["", "Prefixes:", ""]
    lines += [f"- `{prefix}X`: {meaning}" for prefix, meaning in _PREFIXES]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    target = Path(argv[0]) if argv else DOC_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_markdown())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
