"""Apply, verify and clean up the rules with the iptables tools (legacy or nft backend).

The flow is upstream's `executeCommands`:

1. read the current state of each family with `iptables-save`;
2. decide whether Istio residue exists and whether it differs from the
   wanted rules (same ISTIO_* chains with the same rule counts, and every
   wanted rule present per `iptables -C`);
3. with `--reconcile` (or `--cleanup-only`) remove the old rules, behind
   temporary drop-all guardrails when rules are being replaced;
4. unless nothing changed, load the rules with one `iptables-restore
   --noflush` per family.

Cleanup removes every jump into an ISTIO_* chain and every ISTIO_* chain
found in the saved state (whatever configuration created them) plus this
configuration's own non-jump rules in built-in chains, and leaves every
other rule alone.
"""

from __future__ import annotations

from istio_agent.capture.iptables_text import (
    GUARDRAILS,
    blocks_text,
    check_commands,
    guardrail_removal,
    is_empty_state,
    leftover_cleanup,
    parse_save,
    restore_text,
    undo_commands,
)
from istio_agent.capture.kernelstate import legacy_table_names, nft_table_names
from istio_agent.capture.procs import CommandError, run, which
from istio_agent.capture.rules import BUILTIN_CHAINS_AND_TARGETS, Rule, RuleSet

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from istio_agent.capture.iptables_text import SaveState
    from istio_agent.capture.procs import Completed

    Log = Callable[[str], None]

_VARIANTS = {
    "legacy": ("{}-legacy", "{}-legacy-save", "{}-legacy-restore"),
    "nft": ("{}-nft", "{}-nft-save", "{}-nft-restore"),
    "": ("{}", "{}-save", "{}-restore"),
}
RESTORE_WAIT = ("-w", "10")  # legacy xtables take a host-wide lock; wait for it rather than fail
XTABLES_NAMES = frozenset({"filter", "nat", "mangle", "raw", "security"})


class ApplyError(RuntimeError):
    """The rules could not be applied."""


class Tools:
    """The iptables, -save and -restore binaries for one family and backend.

    `available()` remembers where it found them, and `run` starts them from there: one $PATH walk
    per binary, not one more per command (each miss is an `access` call, ~4 us here).
    """

    __slots__ = ("iptables", "paths", "restore", "save", "v6", "variant")

    def __init__(self, variant: str, v6: bool) -> None:
        base = "ip6tables" if v6 else "iptables"
        self.variant = variant
        self.v6 = v6
        self.iptables, self.save, self.restore = (name.format(base) for name in _VARIANTS[variant])
        self.paths: dict[str, str] = {}

    def available(self) -> bool:
        for name in (self.iptables, self.save, self.restore):
            path = which(name)
            if path is None:
                return False
            self.paths[name] = path
        return True

    def run(self, argv: Sequence[str], stdin: bytes | None = None, check: bool = False) -> Completed:
        """`procs.run` of one of these binaries, from where `available()` found it."""
        return run(argv, stdin=stdin, check=check, executable=self.paths.get(argv[0]))

    def __repr__(self) -> str:
        return f"Tools({self.restore})"


def _legacy_has_rules(tools: Tools) -> bool:
    """Legacy tables exist only once used; /proc says so without instantiating any (nor looking for the tools)."""
    if not legacy_table_names(tools.v6):
        return False
    if not tools.available():
        return False
    result = tools.run([tools.save])
    return result.ok and any(line.startswith("-A ") for line in result.stdout.decode().splitlines())


def select_tools(v6: bool, force: str = "") -> Tools:
    """Upstream's backend choice: legacy when it already holds rules, else nft, else the plain name."""
    if force:
        tools = Tools(force, v6)
        if not tools.available():
            raise ApplyError(f"--force-iptables-binary={force}: {tools.restore} and friends are not installed")
        return tools
    legacy = Tools("legacy", v6)
    if _legacy_has_rules(legacy):
        return legacy
    for variant in ("nft", ""):
        tools = Tools(variant, v6)
        if tools.available():
            return tools
    raise ApplyError(f"no usable {'ip6tables' if v6 else 'iptables'} binaries found")


def restore(tools: Tools, text: str) -> None:
    wait = () if tools.variant == "nft" else RESTORE_WAIT
    tools.run([tools.restore, *wait, "--noflush"], stdin=text.encode(), check=True)


def read_state(tools: Tools) -> SaveState | None:
    """The saved state; without running iptables-save when the kernel shows no tables at all."""
    if tools.variant == "nft":
        tables = nft_table_names(tools.v6)
    elif tools.variant == "legacy":
        tables = legacy_table_names(tools.v6)
    else:
        tables = None  # plain `iptables` may be either backend
    if tables is not None and not tables & XTABLES_NAMES:
        return parse_save("")
    result = tools.run([tools.save])
    return parse_save(result.stdout.decode(errors="replace")) if result.ok else None


def differs(tools: Tools, current: SaveState, rules: Sequence[Rule]) -> bool:
    """Upstream's drift test between saved state and the wanted rules."""
    expected = parse_save(restore_text(rules))
    for table, chains in expected.items():
        if table not in current:
            return True
        for chain, chain_rules in chains.items():
            have = current[table].get(chain)
            if have is None or (chain.startswith("ISTIO_") and len(have) != len(chain_rules)):
                return True
    for table, chains in current.items():
        if any(chain.startswith("ISTIO_") and chain not in expected.get(table, {}) for chain in chains):
            return True
    return any(not tools.run([tools.iptables, *cmd]).ok for cmd in check_commands(rules))


class FamilyPlan:
    __slots__ = ("delta", "residue", "rules", "state", "tools")

    def __init__(self, tools: Tools, rules: Sequence[Rule]) -> None:
        self.tools = tools
        self.rules = rules
        self.state: SaveState | None = None
        self.residue = False
        self.delta = False


def cleanup_family(plan: FamilyPlan, log: Log) -> None:
    """Remove every ISTIO_* chain and jump, and this config's own rules in built-in chains."""
    tools = plan.tools
    state = plan.state if plan.state is not None else read_state(tools)
    blocks = leftover_cleanup(state) if state is not None else []
    if blocks:
        try:
            restore(tools, blocks_text(blocks))
        except CommandError as err:
            log(f"batch cleanup failed ({err}); removing rules one by one")
            for table, lines in blocks:
                for line in lines:
                    tools.run([tools.iptables, "-t", table, *line.split(" ")])
    for cmd in undo_commands(reversed(plan.rules)):
        chain, spec = cmd[3], cmd[4:]
        target = spec[-1] if len(spec) >= 2 and spec[-2] == "-j" else ""
        if chain in BUILTIN_CHAINS_AND_TARGETS and not target.startswith("ISTIO_"):
            tools.run([tools.iptables, *cmd])  # absent rules are fine: upstream ignores these errors too


def _guardrails(plans: Sequence[FamilyPlan], on: bool) -> None:
    for plan in plans:
        commands = GUARDRAILS if on else guardrail_removal()
        try:
            restore(plan.tools, blocks_text([("filter", [" ".join(g[2:]) for g in commands])]))
        except CommandError:
            if on:
                raise
            for cmd in guardrail_removal():
                plan.tools.run([plan.tools.iptables, *cmd])


def apply_iptables(
    ruleset: RuleSet,
    log: Log,
    *,
    force_binary: str = "",
    reconcile: bool = False,
    cleanup_only: bool = False,
    force_apply: bool = False,
) -> bool:
    """Bring the kernel to `ruleset`; returns False when it was already in place."""
    plans: list[FamilyPlan] = []
    for v6, rules in ((False, ruleset.v4), (True, ruleset.v6)):
        if not rules and not cleanup_only and not reconcile:
            continue
        try:
            tools = select_tools(v6, force_binary)
        except ApplyError:
            if rules:
                raise
            continue  # no ip6tables at all: nothing of ours can be there
        plans.append(FamilyPlan(tools, rules))
    residue_any = False
    for plan in plans:
        plan.state = read_state(plan.tools)
        if plan.state is None:
            plan.delta = bool(plan.rules)
            continue
        plan.residue = not is_empty_state(plan.state)
        plan.delta = differs(plan.tools, plan.state, plan.rules) if plan.residue else bool(plan.rules)
        residue_any = residue_any or (plan.residue and bool(plan.rules))
    delta = any(p.delta for p in plans) or not residue_any
    if residue_any and delta and not reconcile and not cleanup_only:
        log("existing iptables rules differ from the requested ones; --reconcile is recommended")
    guarded = False
    try:
        if (residue_any and delta and reconcile) or cleanup_only:
            if not cleanup_only:
                _guardrails(plans, on=True)
                guarded = True
            for plan in plans:
                log(f"removing Istio rules with {plan.tools.restore}")
                cleanup_family(plan, log)
        if cleanup_only:
            return True
        if not (delta or force_apply):
            log("iptables rules already in place; nothing to do")
            return False
        for plan in plans:
            if plan.rules:
                try:
                    restore(plan.tools, restore_text(plan.rules))
                except CommandError as err:
                    hint = ""
                    if b"already exists" in err.result.stderr:
                        hint = " (Istio chains from another configuration exist: rerun with --reconcile)"
                    raise ApplyError(f"{err}{hint}") from None
                log(f"applied {len(plan.rules)} rules with {plan.tools.restore}")
        return True
    finally:
        if guarded:
            _guardrails(plans, on=False)
