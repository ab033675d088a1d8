"""Time to apply the default capture rules in a fresh network namespace.

Compares, in the same run and in rotating order, three ways of loading the
same IPv4 rules into a brand-new namespace (one with a pod-like address):

- `istio-iptables --network-namespace <ns> <istio-init's default flags>` run
  through the lean launcher (`python -m istio_agent.cli.iptables_launcher`,
  written to a temporary directory for this run with its bundle of compiled
  modules: `python -IS`, no site): the whole tool, including interpreter
  start-up, flag parsing, validation, host fact detection, the kernel's table
  list (the `iptables-save` probe when there are tables) and the
  `iptables-restore`. This is `apply_ratio`;
- the same through pip's form of the console script (the interpreter with
  site; written here, since `make setup` installs the launcher as
  `.venv/bin/istio-iptables`): `apply_ratio_console_script`;
- `nsenter --net=<ns> iptables-restore --noflush` of the identical rules text;
- upstream's Go `pilot-agent istio-iptables` with the same flags, run inside the
  namespace as its istio-init container runs it (`nsenter --net=<ns>`; given
  `--network-namespace` from outside it would pick the host's iptables
  flavour): `apply_vs_upstream` is ours / its time (aim <= 1.5). Skipped,
  saying why, without upstream's commands (`upstream_arm.py`).

It also reports the bare interpreter start-up (with and without site), and an
in-process comparison (the library's apply vs spawning iptables-restore, both
from a child already inside the namespace) that shows the cost of the tool
minus Python start-up. Where the rest goes: start-up, then imports, then the
tool's work (`floor_ratio`: `python -IS` start-up without the interpreter's
teardown, as the tool ends, plus the in-process restore).

Last, how long `--run-validation` takes to give up when redirection does not
work (`--skip-rule-apply` in a fresh namespace, `--probe-timeout=1s`): the
node test checks that it fails with exit 126, this measures that it does so
promptly, as a multiple of the probe timeout.
Needs root. The last line is one JSON object with the figures (`apply_vs_upstream` among them).
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream_arm import commands, missing, say_missing
from upstream_arm import ratio as ratio_of

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARGS = ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
                "-d", "15090,15021,15020"]  # fmt: skip
REPS = int(os.environ.get("BENCH_CAPTURE_REPS", "25"))
VALIDATION_REPS = int(os.environ.get("BENCH_CAPTURE_VALIDATION_REPS", "3"))
PROBE_TIMEOUT_S = 1.0
VALIDATION_FAILED = 126


def sh(*argv: str, stdin: bytes | None = None) -> None:
    subprocess.run(list(argv), input=stdin, check=True, capture_output=True)


def fresh_namespace() -> str:
    name = f"bench-cap-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "set", "lo", "up")
    sh("ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
    sh("ip", "-n", name, "addr", "add", "10.88.0.2/24", "dev", "eth0")
    sh("ip", "-n", name, "link", "set", "eth0", "up")
    return name


def drop_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def timed(argv: list[str], stdin: bytes | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, input=stdin, capture_output=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {result.stderr.decode()}")
    return elapsed


def rules_text() -> bytes:
    """The IPv4 restore input istio-iptables loads for the default flags."""
    from istio_agent.capture.iptables_text import restore_text
    from istio_agent.capture.rules import build_rules
    from istio_agent.cli.iptables import build_config

    cfg, _ = build_config([*DEFAULT_ARGS, "--enable-ipv6=false"], {})
    return restore_text(build_rules(cfg.replace(proxy_gid="1337", proxy_uid="1337")).v4).encode()


def in_process(ns: str, text: bytes) -> tuple[float, float]:
    """(library apply, spawned restore) timed from a forked child inside fresh namespaces."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        code = 0
        try:
            from istio_agent.capture.apply import apply_iptables
            from istio_agent.capture.netns import enter_netns
            from istio_agent.capture.procs import run
            from istio_agent.capture.program import resolve_host_facts
            from istio_agent.capture.rules import build_rules
            from istio_agent.cli.iptables import build_config

            enter_netns(f"/run/netns/{ns}")
            start = time.perf_counter()
            cfg, _ = build_config(DEFAULT_ARGS, {})
            cfg = resolve_host_facts(cfg, {})
            apply_iptables(build_rules(cfg), lambda _: None)
            library = time.perf_counter() - start
            run(["iptables", "-t", "nat", "-F"], check=True)  # a clean slate for the bare restore
            run(["iptables-restore", "--noflush"], stdin=b"*nat\n-X\nCOMMIT\n", check=True)
            start = time.perf_counter()
            run(["iptables-restore", "--noflush"], stdin=text, check=True)
            bare = time.perf_counter() - start
            os.write(write_fd, json.dumps([library, bare]).encode())
        except BaseException as err:  # report and exit the child, whatever happened
            os.write(write_fd, json.dumps({"error": repr(err)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        data = json.loads(pipe.read())
    os.waitpid(pid, 0)
    if isinstance(data, dict):
        raise RuntimeError(data["error"])
    return data[0], data[1]


def validation_give_up(tool: str) -> float:
    """Seconds `--run-validation` takes to report failure in a fresh namespace without rules."""
    ns = fresh_namespace()
    try:
        start = time.perf_counter()
        result = subprocess.run([tool, "--network-namespace", f"/run/netns/{ns}", *DEFAULT_ARGS, "--skip-rule-apply",
                                 "--run-validation", f"--probe-timeout={PROBE_TIMEOUT_S:g}s"],
                                capture_output=True, timeout=120)
        elapsed = time.perf_counter() - start
    finally:
        drop_namespace(ns)
    if result.returncode != VALIDATION_FAILED:
        raise RuntimeError(f"validation without rules exited {result.returncode}: {result.stderr.decode()}")
    return elapsed


def lean_launcher(directory: Path) -> str:
    """The lean istio-iptables launcher for this installation (and its bundle), written into `directory`."""
    from istio_agent.cli.iptables_launcher import write_launcher

    return str(write_launcher(directory / "istio-iptables"))


def apply_arm(kind: str, tools: dict[str, str], text: bytes) -> float:
    """One arm's seconds in a fresh namespace (made and removed outside the timing)."""
    ns = fresh_namespace()
    try:
        if kind == "bare":
            return timed(["nsenter", f"--net=/run/netns/{ns}", "iptables-restore", "--noflush"], text)
        if kind == "go":
            return timed(["nsenter", f"--net=/run/netns/{ns}", tools[kind], "istio-iptables", *DEFAULT_ARGS])
        return timed([tools[kind], "--network-namespace", f"/run/netns/{ns}", *DEFAULT_ARGS])
    finally:
        drop_namespace(ns)


def main() -> None:
    if os.geteuid() != 0:
        print("bench_capture needs root (network namespaces)")
        print(json.dumps({"apply_ratio": None, "skipped": "needs root"}))
        return
    # An installed package carries bytecode; PYTHONDONTWRITEBYTECODE in CI would otherwise
    # make every run re-compile our modules and measure the compiler, not the tool.
    for target in ("capture", "cli", "config"):
        compileall.compile_dir(str(ROOT / "src" / "istio_agent" / target), quiet=1)
    compileall.compile_file(str(ROOT / "src" / "istio_agent" / "__init__.py"), quiet=1)
    text = rules_text()
    workdir = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    try:
        # pip's form of the console script, written here: `make setup` installs the lean launcher in its place.
        from istio_agent.cli.iptables_launcher import console_script

        console = console_script(workdir / "istio-iptables-console")
        tools = {"cli": lean_launcher(workdir), "console": str(console)}
        why_not = missing("pilot-agent")
        if why_not:
            say_missing("bench_capture", why_not)
        else:
            tools["go"] = str(commands().pilot_agent)
        figures(text, tools, why_not)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def figures(text: bytes, tools: dict[str, str], why_not: str) -> None:
    arms = ("cli", "console", "bare", *(("go",) if "go" in tools else ()))
    series: dict[str, list[float]] = {name: [] for name in (*arms, "startup", "startup_is", "startup_exit", "lib",
                                                              "lib_bare")}
    for rep in range(REPS + 1):
        for kind in arms[rep % len(arms):] + arms[: rep % len(arms)]:  # each arm in each place in turn
            elapsed = apply_arm(kind, tools, text)
            if rep:  # the first round warms caches
                series[kind].append(elapsed)
        startup = timed([sys.executable, "-c", "pass"])
        startup_is = timed([sys.executable, "-IS", "-c", "pass"])
        startup_exit = timed([sys.executable, "-IS", "-c", "import posix; posix._exit(0)"])
        ns = fresh_namespace()
        try:
            library, spawned = in_process(ns, text)
        finally:
            drop_namespace(ns)
        if rep:
            series["startup"].append(startup)
            series["startup_is"].append(startup_is)
            series["startup_exit"].append(startup_exit)
            series["lib"].append(library)
            series["lib_bare"].append(spawned)
    ms = {name: statistics.median(values) * 1000 for name, values in series.items()}
    low = {name: min(values) * 1000 for name, values in series.items()}
    print(f"rules: {len(text.splitlines())} restore lines (IPv4, istio-init defaults); {REPS} reps; median (min)")
    rows = [
        ("cli", "istio-iptables, lean launcher (python -IS; fresh netns)"),
        ("console", "istio-iptables, pip's console script (with site)"),
        ("bare", "nsenter + iptables-restore (same rules)"),
        *((("go", "nsenter + upstream's Go pilot-agent istio-iptables"),) if "go" in ms else ()),
        ("startup", "python -c pass (interpreter start-up, with site)"),
        ("startup_is", "python -IS -c pass (interpreter start-up, no site)"),
        ("startup_exit", "python -IS, posix._exit (start-up, no site, no teardown)"),
        ("lib", "in-process: library apply (facts, probe, restore)"),
        ("lib_bare", "in-process: spawned iptables-restore alone"),
    ]
    for key, label in rows:
        print(f"{label:58s} {ms[key]:7.2f} ms ({low[key]:.2f})")
    ratio = ms["cli"] / ms["bare"]
    floor = ms["startup_exit"] + ms["lib_bare"]
    print(
        f"apply ratio (tool / bare restore): {ratio:.2f}x median, {low['cli'] / low['bare']:.2f}x best "
        f"(aim <= 4.5x); through the console script {ms['console'] / ms['bare']:.2f}x; "
        f"interpreter start-up alone (-IS) is {ms['startup_is'] / ms['bare']:.2f}x the bare restore; "
        f"in-process ratio {ms['lib'] / ms['lib_bare']:.2f}x"
    )
    print(
        f"where the lean launcher's {ms['cli']:.2f} ms go: python -IS start-up without teardown "
        f"{ms['startup_exit']:.2f} (the tool ends with posix._exit), the library's work in-process {ms['lib']:.2f} "
        f"(of it iptables-restore {ms['lib_bare']:.2f}), imports and the rest "
        f"{ms['cli'] - ms['startup_exit'] - ms['lib']:.2f}; the floor (start-up + restore) is {floor:.2f} ms = "
        f"{floor / ms['bare']:.2f}x"
    )
    upstream: dict[str, float | str | None] = {"upstream": why_not}
    if "go" in ms:
        upstream = {"upstream_apply_ms": round(ms["go"], 3), "apply_vs_upstream": ratio_of(ms["cli"], ms["go"]),
                    "upstream_apply_ratio": round(ms["go"] / ms["bare"], 3)}
        print(f"ours / upstream's Go istio-iptables: {upstream['apply_vs_upstream']} (aim <= 1.5); upstream's is "
              f"{upstream['upstream_apply_ratio']}x the bare restore")
    give_up = statistics.median(validation_give_up(tools["cli"]) for _ in range(VALIDATION_REPS))
    print(f"--run-validation without rules gives up after {give_up * 1000:.0f} ms "
          f"({give_up / PROBE_TIMEOUT_S:.2f}x the {PROBE_TIMEOUT_S:g} s probe timeout; median of {VALIDATION_REPS})")
    print(
        json.dumps(
            {
                "apply_ratio": round(ratio, 3),
                "apply_ratio_best": round(low["cli"] / low["bare"], 3),
                "apply_ratio_console_script": round(ms["console"] / ms["bare"], 3),
                "cli_ms": round(ms["cli"], 3),
                "console_script_ms": round(ms["console"], 3),
                "bare_restore_ms": round(ms["bare"], 3),
                "python_startup_ms": round(ms["startup"], 3),
                "python_startup_is_ms": round(ms["startup_is"], 3),
                "python_startup_is_no_teardown_ms": round(ms["startup_exit"], 3),
                "floor_ratio": round(floor / ms["bare"], 3),
                "inprocess_apply_ratio": round(ms["lib"] / ms["lib_bare"], 3),
                "validation_fail_ms": round(give_up * 1000, 1),
                "validation_fail_over_probe_timeout": round(give_up / PROBE_TIMEOUT_S, 3),
                **upstream,
            }
        )
    )


if __name__ == "__main__":
    main()
