"""Pure renderings of a rule list for the iptables tools.

- `restore_text()`: the `iptables-restore --noflush` input, byte-compatible with
  upstream's `BuildV4Restore`/`BuildV6Restore` (tables sorted, `-N` for every
  chain that owns a rule and then for every jump target not yet declared, the
  rules in generation order with insert positions left as given).
- `cleanup_commands()` / `check_commands()`: upstream's undo (`-D`, then
  `-F`/`-X`) and check (`-C`) argument lists.
- `dry_run_record()`: the exact line sequence upstream's recording stub writes.
- `parse_save()`: upstream's `GetStateFromSave`, used for drift detection and
  for finding every leftover `ISTIO_*` chain and jump at cleanup time.
"""

from __future__ import annotations

from istio_agent.capture.rules import BUILTIN_CHAINS_AND_TARGETS, Rule, RuleSet

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

SaveState = dict[str, dict[str, list[str]]]

DEFAULT_TABLES = ("filter", "nat", "mangle", "raw")


def restore_text(rules: Sequence[Rule]) -> str:
    """The restore input for one family; empty when there are no rules."""
    tables: dict[str, list[str]] = {"filter": [], "nat": [], "mangle": []}
    declared: set[tuple[str, str]] = set()

    def declare(table: str, chain: str) -> None:
        if (chain, table) in declared:
            return
        declared.add((chain, table))
        if chain not in BUILTIN_CHAINS_AND_TARGETS:
            tables.setdefault(table, []).append(f"-N {chain}")

    for rule in rules:
        declare(rule.table, rule.chain)
    for rule in rules:
        target = rule.jump_target
        if target is not None:
            declare(rule.table, target)
    for rule in rules:
        tables.setdefault(rule.table, []).append(rule.text())
    out: list[str] = []
    for table in sorted(tables):
        lines = tables[table]
        if lines:
            out.append(f"* {table}")
            out.extend(lines)
            out.append("COMMIT")
    return "".join(f"{line}\n" for line in out)


def _with_op(rule: Rule, op: str) -> tuple[str, ...]:
    """`-t table <op> chain spec` for a rule (insert positions dropped)."""
    return ("-t", rule.table, op, rule.chain, *rule.spec)


def check_commands(rules: Sequence[Rule]) -> list[tuple[str, ...]]:
    """`iptables -C` argument lists proving each rule is present (upstream's CheckRules)."""
    return [_with_op(rule, "-C") for rule in rules]


def undo_commands(rules: Iterable[Rule]) -> list[tuple[str, ...]]:
    """`-D` argument lists for rules outside ISTIO_* chains and for jumps into ISTIO_* chains.

    Plain rules inside ISTIO_* chains are skipped: those chains are flushed anyway.
    """
    out = []
    for rule in rules:
        target = _jump_anywhere(rule.spec)
        if rule.chain.startswith("ISTIO_") and not (target or "").startswith("ISTIO_"):
            continue
        out.append(_with_op(rule, "-D"))
    return out


def cleanup_commands(rules: Sequence[Rule]) -> list[tuple[str, ...]]:
    """Upstream's BuildCleanup: undo in reverse order, then flush and delete owned chains."""
    reverse = list(reversed(rules))
    out = undo_commands(reverse)
    seen: set[tuple[str, str]] = set()
    for rule in reverse:
        key = (rule.chain, rule.table)
        if key in seen or rule.chain in BUILTIN_CHAINS_AND_TARGETS:
            continue
        seen.add(key)
        out.append(("-t", rule.table, "-F", rule.chain))
        out.append(("-t", rule.table, "-X", rule.chain))
    return out


def _jump_anywhere(spec: Sequence[str]) -> str | None:
    for i, token in enumerate(spec[:-1]):
        if token in ("-j", "--jump"):
            return spec[i + 1].strip("'\"")
    return None


def dry_run_record(ruleset: RuleSet, ipv6: bool, cleanup_only: bool = False) -> list[str]:
    """The lines upstream's dependency stub records for a run against a clean host.

    Both state probes always run; a clean host always needs the rules, so the
    IPv4 restore input is recorded line by line (the restore command itself is
    not), then the IPv6 input (nothing when it is empty), then the final-state
    probes. With cleanup-only, the undo commands are recorded instead.
    """
    lines = ["iptables-save", "ip6tables-save"]
    if cleanup_only:
        lines += [" ".join(("iptables", *c)) for c in cleanup_commands(ruleset.v4)]
        lines += [" ".join(("ip6tables", *c)) for c in cleanup_commands(ruleset.v6)]
    else:
        lines += restore_text(ruleset.v4).splitlines()
        lines += restore_text(ruleset.v6).splitlines()
    lines.append("iptables-save")
    if ipv6:
        lines.append("ip6tables-save")
    return lines


def parse_save(text: str) -> SaveState:
    """Tables -> chains -> rule lines, from iptables-save output (ISTIO_* chains always listed)."""
    state: SaveState = {table: {} for table in DEFAULT_TABLES}
    table = ""
    for line in text.split("\n"):
        if not line.strip() or line.startswith("#") or line == "COMMIT":
            continue
        if line.startswith("*"):
            table = line[1:].strip()
            state.setdefault(table, {})
            continue
        if line.startswith(":"):
            if line.startswith(":ISTIO"):
                state.setdefault(table, {}).setdefault(line.split(" ")[0][1:], [])
            continue
        words = line.split(" ")
        chain = ""
        for i, word in enumerate(words[:-1]):
            if word in ("-A", "--append", "-I", "--insert"):
                chain = words[i + 1]
        if chain:
            state.setdefault(table, {}).setdefault(chain, []).append(line)
    return state


def is_empty_state(state: SaveState) -> bool:
    return all(not chains for chains in state.values())


def istio_leftovers(state: SaveState) -> dict[str, tuple[list[str], list[str]]]:
    """Per table: the ISTIO_* chains and the saved rules (outside them) that jump into one."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for table, chains in state.items():
        istio_chains = [c for c in chains if c.startswith("ISTIO_")]
        jumps = [
            line
            for chain, lines in chains.items()
            if not chain.startswith("ISTIO_")
            for line in lines
            if (_jump_anywhere(line.split()) or "").startswith("ISTIO_")
        ]
        if istio_chains or jumps:
            out[table] = (istio_chains, jumps)
    return out


def leftover_cleanup(state: SaveState) -> list[tuple[str, list[str]]]:
    """Per table, the restore lines removing every ISTIO_* chain and every jump into one.

    Jump rules are deleted using their saved text (so they match exactly), then
    every ISTIO_* chain is flushed before any is deleted (they reference each other).
    """
    out: list[tuple[str, list[str]]] = []
    for table, (chains, jumps) in sorted(istio_leftovers(state).items()):
        lines = []
        for line in jumps:
            words = line.split(" ")
            if words[0] in ("-A", "--append"):
                words[0] = "-D"
            lines.append(" ".join(words))
        lines += [f"-F {chain}" for chain in chains]
        lines += [f"-X {chain}" for chain in chains]
        out.append((table, lines))
    return out


def blocks_text(blocks: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Restore input from (table, lines) blocks."""
    out: list[str] = []
    for table, lines in blocks:
        out += [f"*{table}", *lines, "COMMIT"]
    return "".join(f"{line}\n" for line in out)


GUARDRAILS: tuple[tuple[str, ...], ...] = tuple(
    ("-t", "filter", "-I", chain, "1", "-p", proto, "-j", "DROP")
    for chain in ("INPUT", "FORWARD", "OUTPUT")
    for proto in ("tcp", "udp")
)


def guardrail_removal() -> list[tuple[str, ...]]:
    """`-D` forms of the guardrails (drop-all rules held while rules are swapped)."""
    return [(*g[:2], "-D", g[3], *g[5:]) for g in GUARDRAILS]
