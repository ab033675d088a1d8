"""Parsing the mesh file: text in, a frozen `Mesh` out, or a `RegistryError` naming the line and field.

The file describes a whole mesh for `istiod-local up`, in the words of the
Kubernetes and Istio objects it stands for (one document, every key optional
except where noted)::

    apiVersion: istio-agent.local/v1        # optional; if present, this value
    kind: Mesh                              # optional; if present, this value
    namespaces:                             # `default` exists even if not listed
    - name: secure
      peerAuthentication: STRICT            # STRICT | PERMISSIVE (default) | DISABLE
      labels: {team: payments}
    services:
    - name: reviews
      namespace: default                    # default: default
      selector: {app: reviews}              # default: {app: <name>}
      clusterIP: 10.96.0.11                 # default: allocated by istiod-local
      ports:
      - {name: http, port: 9080, targetPort: 8080, protocol: HTTP}   # HTTP | HTTP2 | GRPC | TCP
    deployments:
    - name: reviews-v1                      # pods are <name>-1, <name>-2, ...
      namespace: default
      replicas: 2                           # 0..100, default 1 (`up --scale N` multiplies it)
      serviceAccount: reviews               # default: the deployment's name
      labels: {app: reviews, version: v1}   # default: {app: <name>}
      mode: sidecar                         # sidecar (Envoy, default) | proxyless (gRPC) | none (no mesh)
                                            # | gateway (`pilot-agent proxy router`: an ingress gateway)
      hostPorts: [{hostPort: 31380, containerPort: 8080}]   # gateway only: 127.0.0.1:31380 on the host
      dnsCapture: true                      # the agent's DNS proxy (sidecar only), default false
      agent: istio-agent                    # istio-agent (ours, default) | upstream (upstream's Go pilot-agent)
      app:                                  # or a bare kind: `app: client`
        kind: http-echo                     # http-echo | tcp-echo | grpc-server | grpc-client | client | none
        port: 8080                          # what a server listens on
        next: [ratings.secure:9080]         # http-echo: each request it serves calls these first
        calls: [frontend:80]                # client, grpc-client: called every `interval` seconds
        interval: 1                         # seconds, default 1
    expectations:                           # optional: what the check must see, over what the policies say
    - {from: legacy, to: ratings.secure, port: 9080, outcome: refused}   # mtls | plaintext | refused | denied
    - {from: sleep, to: ratings.secure, headers: {x-wasm-plugin: add-header}}   # HTTP answers carry these
    istioConfig: [istio/]                   # files or directories of Istio resources (relative to this file)
    wasmModules: [wasm/add-header.wat]      # Wasm modules `up` serves the pods over HTTP (relative to this file)
    serviceEntries:
    - name: legacy
      namespace: default
      hosts: [legacy.example.internal]
      addresses: [10.97.0.10]               # the VIP the DNS proxy answers
      ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
      resolution: STATIC                    # STATIC (default) | DNS | NONE
      endpoints:
      - deployment: legacy                  # every pod of a deployment ([<namespace>/]<name>), or
      - address: 10.244.0.250               # a fixed address

A call target (`next`, `calls`) names a service as `name`, `name.namespace`
or its FQDN, or a service entry by one of its hosts, each optionally with
`:port` (needed when the service has more than one). It is resolved here,
so a typo is refused with its line rather than failing at run time.

What a mode can do, checked here: a `none` pod is outside the mesh (no
capture, no agent), so it calls nothing through the mesh; a `proxyless` pod
speaks only gRPC over xDS (its calls must be GRPC ports, `grpc-client` is
its client app, and it has no DNS proxy); a `client` app needs a sidecar;
a service entry is reached by name, so its callers need `dnsCapture`.
Deployment names are unique across namespaces: they name pods on one node.
A `gateway` pod runs no app and calls nothing: it routes what Istio's Gateway
and VirtualService resources (`istioConfig:`) give it; its `hostPorts` lead
from the host's loopback to its first pod, each host port once in the file.
`istioConfig:` entries are paths as written; `mesh.istiofiles` reads them.
`wasmModules:` entries too: files (`.wat`, built by wat2wasm, or `.wasm`)
`mesh.wasmfiles` builds and serves as `<stem>.wasm`; two of one name are refused here.
An expectation with `headers` (HTTP targets only) adds them to what the
policies say (or to its own `outcome`): the answers must carry each header
with that value.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from yaml.nodes import Node, ScalarNode

from istiod_local.controlplane.xds.yamlfields import (
    Fields,
    RegistryError,
    choice,
    compose,
    describe,
    dns_label,
    ip_address,
    line_of,
    protocol_from_name,
)
from istiod_local.mesh.model import (
    AGENTS,
    APP_KINDS,
    CLIENT_KINDS,
    DEFAULT_CALL_INTERVAL,
    DEFAULT_NAMESPACE,
    MODES,
    MTLS_MODES,
    OUTCOMES,
    PROTOCOLS,
    RESOLUTIONS,
    SERVER_KINDS,
    App,
    Deployment,
    EntryEndpoint,
    Expectation,
    HostPort,
    Mesh,
    Namespace,
    Port,
    Service,
    ServiceEntry,
    Target,
)

API_VERSION = "istio-agent.local/v1"
KIND = "Mesh"
MAX_REPLICAS = 100
# Pod names are `<deployment>-<n>` and the node takes at most 42 characters (plan.PodSpec's rule).
MAX_DEPLOYMENT_NAME = 36

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TOP = frozenset({"apiVersion", "kind", "namespaces", "services", "deployments", "serviceEntries", "expectations",
                  "istioConfig", "wasmModules"})
_EXPECTATION = frozenset({"from", "to", "port", "outcome", "headers"})
_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP field name (a token), lowercase
_MODULE_SUFFIXES = (".wat", ".wasm")
_NAMESPACE = frozenset({"name", "peerAuthentication", "labels"})
_SERVICE = frozenset({"name", "namespace", "selector", "clusterIP", "ports"})
_PORT = frozenset({"name", "port", "targetPort", "protocol"})
_ENTRY_PORT = frozenset({"name", "number", "targetPort", "protocol"})
_DEPLOYMENT = frozenset({"name", "namespace", "replicas", "serviceAccount", "labels", "mode", "dnsCapture", "app",
                         "agent", "hostPorts"})
_HOST_PORT = frozenset({"hostPort", "containerPort"})
_APP = frozenset({"kind", "port", "next", "calls", "interval"})
_ENTRY = frozenset({"name", "namespace", "hosts", "addresses", "ports", "resolution", "endpoints"})
_ENDPOINT = frozenset({"address", "deployment"})
_BOOL_TAG = "tag:yaml.org,2002:bool"






def _boolean(f: Fields, key: str, default: bool) -> bool:
    if not f.has(key):
        return default
    node = f.value_node(key)
    if not isinstance(node, ScalarNode) or node.tag != _BOOL_TAG:
        f.fail(node, key, f"must be true or false, got {describe(node)}")
    return str(node.value).lower() in ("true", "yes", "on", "y")


def _seconds(f: Fields, key: str, default: float) -> float:
    if not f.has(key):
        return default
    text = f.string(key)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:
        f.fail(f.value_node(key), key, f"must be a number of seconds between 0.05 and 3600, got {text!r}")
    return value




def _in_namespace(f: Fields, key: str, declared: dict[str, Namespace]) -> str:
    namespace = dns_label(f, key, DEFAULT_NAMESPACE)
    if namespace not in declared:
        f.fail(f.value_node(key), key, f"namespace {namespace!r} is not declared under namespaces")
    return namespace




def _ports(f: Fields, number_key: str, allowed: frozenset[str]) -> tuple[Port, ...]:
    out: list[Port] = []
    seen: dict[int, str] = {}
    for path, node in f.items("ports", required=True):
        pf = Fields(node, path, f.source, allowed)
        number = pf.integer(number_key, low=1, high=65535)
        if number in seen:
            pf.fail(pf.value_node(number_key), number_key, f"port {number} is already declared at {seen[number]}")
        seen[number] = path
        name = pf.string("name", "")
        protocol = choice(pf, "protocol", PROTOCOLS, protocol_from_name(name))
        out.append(Port(name, number, pf.integer("targetPort", number, 1, 65535), protocol))
    return tuple(out)


def _namespaces(top: Fields) -> dict[str, Namespace]:
    out: dict[str, Namespace] = {}
    for path, node in top.items("namespaces"):
        f = Fields(node, path, top.source, _NAMESPACE)
        name = dns_label(f, "name")
        if name in out:
            f.fail(f.value_node("name"), "name", f"namespace {name!r} is declared twice")
        out[name] = Namespace(name, choice(f, "peerAuthentication", MTLS_MODES, "PERMISSIVE"), f.string_map("labels"),
                              f.has("peerAuthentication"))
    out.setdefault(DEFAULT_NAMESPACE, Namespace(DEFAULT_NAMESPACE))
    return out


def _services(top: Fields, namespaces: dict[str, Namespace]) -> list[Service]:
    out: list[Service] = []
    seen: dict[str, str] = {}
    ips: dict[str, str] = {}
    for path, node in top.items("services"):
        f = Fields(node, path, top.source, _SERVICE)
        name = dns_label(f, "name")
        namespace = _in_namespace(f, "namespace", namespaces)
        key = f"{namespace}/{name}"
        if key in seen:
            f.fail(f.value_node("name"), "name", f"service {key} is already defined at {seen[key]}")
        seen[key] = path
        cluster_ip = ip_address(f, "clusterIP", 4)
        if cluster_ip and cluster_ip in ips:
            f.fail(f.value_node("clusterIP"), "clusterIP", f"{cluster_ip} is already used by {ips[cluster_ip]}")
        if cluster_ip:
            ips[cluster_ip] = path
        selector = f.string_map("selector") if f.has("selector") else {"app": name}
        out.append(Service(name, namespace, selector, _ports(f, "port", _PORT), cluster_ip))
    return out


def _entry_endpoint(f: Fields, namespace: str) -> EntryEndpoint:
    if f.has("address") == f.has("deployment"):
        f.fail(f.node, "", "give exactly one of address or deployment")
    if f.has("address"):
        return EntryEndpoint(address=ip_address(f, "address", 4))
    ref = f.string("deployment")
    space, _, name = ref.rpartition("/")
    return EntryEndpoint(deployment=f"{space or namespace}/{name}")


def _entries(top: Fields, namespaces: dict[str, Namespace]) -> list[tuple[ServiceEntry, Fields]]:
    out: list[tuple[ServiceEntry, Fields]] = []
    names: dict[str, str] = {}
    hosts: dict[str, str] = {}
    for path, node in top.items("serviceEntries"):
        f = Fields(node, path, top.source, _ENTRY)
        name = dns_label(f, "name")
        if name in names:
            f.fail(f.value_node("name"), "name", f"service entry {name!r} is already defined at {names[name]}")
        names[name] = path
        namespace = _in_namespace(f, "namespace", namespaces)
        entry_hosts = []
        for host_path, host_node, host in f.string_list("hosts", required=True):
            host = host.lower()
            if not _DNS_NAME.match(host):
                raise RegistryError(top.source, line_of(host_node), host_path, f"not a DNS name: {host!r}")
            if host in hosts:
                raise RegistryError(top.source, line_of(host_node), host_path,
                                    f"host {host} is already named at {hosts[host]}")
            hosts[host] = host_path
            entry_hosts.append(host)
        addresses = []
        for address_path, address_node, address in f.string_list("addresses"):
            try:
                addresses.append(str(ipaddress.IPv4Address(address)))
            except ValueError:
                raise RegistryError(top.source, line_of(address_node), address_path,
                                    f"must be an IPv4 address, got {address!r}") from None
        endpoints = tuple(_entry_endpoint(Fields(n, p, top.source, _ENDPOINT), namespace)
                          for p, n in f.items("endpoints"))
        resolution = choice(f, "resolution", RESOLUTIONS, "STATIC")
        if resolution == "STATIC" and not endpoints:
            f.fail(f.value_node("resolution") if f.has("resolution") else f.node, "resolution",
                   "STATIC needs endpoints")
        out.append((ServiceEntry(name, namespace, tuple(entry_hosts), tuple(addresses),
                                 _ports(f, "number", _ENTRY_PORT), resolution, endpoints), f))
    return out


class _Resolver:
    """Turns a call reference (`name[.ns][:port]`, an FQDN, or a service-entry host) into a `Target`."""

    def __init__(self, services: list[Service], entries: list[ServiceEntry]) -> None:
        self.services = {s.key: s for s in services}
        self.hosts = {host: e for e in entries for host in e.hosts}

    def lookup(self, host: str, namespace: str) -> Service | ServiceEntry:
        """The service (`name`, `name.namespace`, FQDN) or service entry (one of its hosts) a name means."""
        host = host.strip().lower()
        entry = self.hosts.get(host)
        if entry is not None:
            return entry
        parts = host.split(".")
        if len(parts) == 5 and parts[2:] == ["svc", "cluster", "local"]:
            parts = parts[:2]
        if len(parts) > 2 or not all(parts):
            raise ValueError(f"{host!r} names no service (name, name.namespace or its FQDN) and no service entry host")
        key = f"{parts[1] if len(parts) == 2 else namespace}/{parts[0]}"
        service = self.services.get(key)
        if service is None:
            raise ValueError(f"no service {key} and no service entry host {host!r}")
        return service

    def resolve(self, text: str, namespace: str) -> Target:
        """The target; ValueError with the reason when it names nothing or is ambiguous."""
        host, colon, port_text = text.strip().rpartition(":") if ":" in text else (text.strip(), "", "")
        port: int | None = None
        if colon:
            if not port_text.isdigit():
                raise ValueError(f"port {port_text!r} is not a number")
            port = int(port_text)
        found = self.lookup(host, namespace)
        if isinstance(found, ServiceEntry):
            chosen = _pick_port(found.ports, port, f"service entry {found.name}")
            return Target(host.strip().lower(), chosen.port, chosen.protocol, entry=found.name)
        chosen = _pick_port(found.ports, port, f"service {found.key}")
        return Target(found.hostname(), chosen.port, chosen.protocol, service=found.key)


def _pick_port(ports: tuple[Port, ...], wanted: int | None, what: str) -> Port:
    if wanted is None:
        if len(ports) != 1:
            raise ValueError(f"{what} has {len(ports)} ports: add :port")
        return ports[0]
    found = next((p for p in ports if p.port == wanted), None)
    if found is None:
        raise ValueError(f"{what} has no port {wanted} (ports: {', '.join(str(p.port) for p in ports)})")
    return found


def _targets(f: Fields, key: str, resolver: _Resolver, namespace: str, mode: str,
             dns_capture: bool) -> tuple[Target, ...]:
    out = []
    for path, node, text in f.string_list(key):
        try:
            target = resolver.resolve(text, namespace)
        except ValueError as exc:
            raise RegistryError(f.source, line_of(node), path, str(exc)) from None
        if mode == "proxyless" and target.protocol != "GRPC":
            raise RegistryError(f.source, line_of(node), path,
                                f"a proxyless pod speaks only gRPC over xDS; {text!r} is {target.protocol}")
        if target.is_entry and not dns_capture:
            raise RegistryError(f.source, line_of(node), path,
                                f"{text!r} is a service entry, reached by name: the deployment needs dnsCapture: true")
        out.append(target)
    return tuple(out)


def _app(f: Fields, resolver: _Resolver, namespace: str, mode: str, dns_capture: bool) -> App:
    if not f.has("app"):
        return App()
    node: Node = f.value_node("app")
    if isinstance(node, ScalarNode):
        kind = f.string("app")
        if kind not in APP_KINDS:
            f.fail(node, "app", f"must be one of {', '.join(APP_KINDS)}, got {kind!r}")
        af: Fields | None = None
    else:
        af = Fields(node, f.child_path("app"), f.source, _APP)
        kind = choice(af, "kind", APP_KINDS, "none")
    where, fields = (af, af) if af is not None else (f, None)
    if kind in SERVER_KINDS and (fields is None or not fields.has("port")):
        where.fail(where.node, "port", f"a {kind} app needs the port it listens on")
    if kind == "grpc-client" and mode != "proxyless":
        where.fail(node, "kind" if af else "app", "grpc-client is the proxyless client: needs mode: proxyless "
                                                  "(a sidecar pod calls gRPC with the `client` app)")
    if kind == "client" and mode != "sidecar":
        where.fail(node, "kind" if af else "app", f"a client app calls through a sidecar; mode is {mode}")
    if fields is None:
        return App(kind)
    port = fields.integer("port", 0, 1, 65535) if fields.has("port") else 0
    if port and kind not in SERVER_KINDS:
        fields.fail(fields.value_node("port"), "port", f"a {kind} app listens on no port")
    if port in (15000, 15001, 15004, 15006, 15020, 15021, 15053, 15090):
        fields.fail(fields.value_node("port"), "port", f"port {port} is the sidecar's own")
    if fields.has("next") and kind != "http-echo":
        fields.fail(fields.value_node("next"), "next", "only an http-echo app calls next hops")
    if fields.has("calls") and kind not in CLIENT_KINDS:
        fields.fail(fields.value_node("calls"), "calls",
                    f"only {' and '.join(CLIENT_KINDS)} apps call in the background (an http-echo uses next)")
    if mode == "none" and fields.has("next"):
        fields.fail(fields.value_node("next"), "next", "a pod outside the mesh reaches no service through it")
    return App(kind, port, _targets(fields, "next", resolver, namespace, mode, dns_capture),
               _targets(fields, "calls", resolver, namespace, mode, dns_capture),
               _seconds(fields, "interval", DEFAULT_CALL_INTERVAL))


def _host_ports(f: Fields, mode: str, taken: dict[int, str]) -> tuple[HostPort, ...]:
    """A gateway's host ports: each a port of the host's loopback, given once in the whole file."""
    if not f.has("hostPorts"):
        return ()
    if mode != "gateway":
        f.fail(f.value_node("hostPorts"), "hostPorts", f"only a gateway deployment has host ports; mode is {mode}")
    out = []
    for path, node in f.items("hostPorts"):
        pf = Fields(node, path, f.source, _HOST_PORT)
        host_port = pf.integer("hostPort", low=1, high=65535)
        if host_port in taken:
            pf.fail(pf.value_node("hostPort"), "hostPort",
                    f"host port {host_port} is already given at {taken[host_port]}")
        taken[host_port] = path
        out.append(HostPort(host_port, pf.integer("containerPort", low=1, high=65535)))
    return tuple(out)


def _deployments(top: Fields, namespaces: dict[str, Namespace], resolver: _Resolver) -> list[Deployment]:
    out: list[Deployment] = []
    seen: dict[str, str] = {}
    host_ports: dict[int, str] = {}
    for path, node in top.items("deployments"):
        f = Fields(node, path, top.source, _DEPLOYMENT)
        name = dns_label(f, "name")
        if len(name) > MAX_DEPLOYMENT_NAME:
            f.fail(f.value_node("name"), "name", f"at most {MAX_DEPLOYMENT_NAME} characters (pods are <name>-<n>)")
        if name in seen:
            f.fail(f.value_node("name"), "name", f"deployment {name!r} is already defined at {seen[name]} "
                                                 "(names are unique across namespaces: they name pods on one node)")
        seen[name] = path
        namespace = _in_namespace(f, "namespace", namespaces)
        mode = choice(f, "mode", MODES, "sidecar")
        dns_capture = _boolean(f, "dnsCapture", False)
        if dns_capture and mode != "sidecar":
            f.fail(f.value_node("dnsCapture"), "dnsCapture", f"DNS capture is the sidecar agent's; mode is {mode}")
        agent = choice(f, "agent", AGENTS, AGENTS[0])
        if mode == "none" and f.has("agent"):
            f.fail(f.value_node("agent"), "agent", "a pod outside the mesh (mode: none) runs no agent")
        labels = f.string_map("labels") if f.has("labels") else {"app": name}
        app = _app(f, resolver, namespace, mode, dns_capture)
        if mode == "gateway" and app.kind != "none":
            f.fail(f.value_node("app"), "app", "a gateway runs no app: it routes what its Gateway and "
                                               "VirtualService resources say (istioConfig)")
        out.append(Deployment(name, namespace, f.integer("replicas", 1, 0, MAX_REPLICAS),
                              dns_label(f, "serviceAccount", name), labels, mode, app, dns_capture, agent,
                              _host_ports(f, mode, host_ports)))
    return out


def _check_entry_endpoints(entries: list[tuple[ServiceEntry, Fields]], deployments: list[Deployment]) -> None:
    known = {d.key for d in deployments}
    for entry, f in entries:
        for index, endpoint in enumerate(entry.endpoints):
            if endpoint.deployment and endpoint.deployment not in known:
                node = next(n for i, (_, n) in enumerate(f.items("endpoints")) if i == index)
                raise RegistryError(f.source, line_of(node), f"{f.child_path('endpoints')}[{index}].deployment",
                                    f"no deployment {endpoint.deployment}")


def _expectations(top: Fields, resolver: _Resolver, deployments: list[Deployment]) -> tuple[Expectation, ...]:
    """Declared outcomes: `from` a deployment (`[namespace/]name`), `to` a service or entry, optionally a port."""
    known = {d.key: d for d in deployments} | {d.name: d for d in deployments}
    out = []
    for path, node in top.items("expectations"):
        f = Fields(node, path, top.source, _EXPECTATION)
        client = known.get(f.string("from"))
        if client is None:
            f.fail(f.value_node("from"), "from", f"no deployment {f.string('from')!r}")
        assert client is not None
        try:
            target = resolver.lookup(f.string("to"), client.namespace)
        except ValueError as exc:
            f.fail(f.value_node("to"), "to", str(exc))
            raise
        port = f.integer("port", 0, 1, 65535) if f.has("port") else 0
        if port and all(p.port != port for p in target.ports):
            f.fail(f.value_node("port"), "port", f"{f.string('to')} has no port {port}")
        service, entry = (target.key, "") if isinstance(target, Service) else ("", target.name)
        headers = _headers(f, target, port)
        outcome = choice(f, "outcome", OUTCOMES) if f.has("outcome") else ("" if headers else "mtls")
        out.append(Expectation(client.key, service, entry, port, outcome, headers))
    return tuple(out)


def _headers(f: Fields, target: Service | ServiceEntry, port: int) -> tuple[tuple[str, str], ...]:
    """`headers`: response headers (names lowercased) the target's HTTP answers carry; it needs an HTTP port."""
    if not f.has("headers"):
        return ()
    node = f.value_node("headers")
    given = f.string_map("headers")
    if not given:
        f.fail(node, "headers", "must name at least one header")
    for name in given:
        if not _HEADER_NAME.match(name.lower()):
            f.fail(node, "headers", f"{name!r} is not an HTTP header name")
    http = [p for p in target.ports if p.protocol in ("HTTP", "HTTP2") and (not port or p.port == port)]
    if not http:
        f.fail(node, "headers", f"only HTTP answers carry headers: {f.string('to')} has no HTTP port"
               + (f" {port}" if port else ""))
    return tuple(sorted((name.lower(), value) for name, value in given.items()))


def _wasm_modules(top: Fields) -> tuple[str, ...]:
    """`wasmModules:` paths as written: `.wat` or `.wasm` files, each served name (`<stem>.wasm`) once."""
    out: list[str] = []
    served: dict[str, str] = {}
    for path, node, text in top.string_list("wasmModules"):
        name = Path(text).name
        stem, suffix = Path(name).stem, Path(name).suffix
        if suffix not in _MODULE_SUFFIXES:
            raise RegistryError(top.source, line_of(node), path, f"a Wasm module is a .wat or .wasm file, got {text!r}")
        if not _DNS_NAME.match(stem.lower()) or stem != stem.lower():
            raise RegistryError(top.source, line_of(node), path,
                                f"the module is served as {stem}.wasm: its name must be lowercase letters, digits, "
                                "'-' and '.'")
        if stem in served:
            raise RegistryError(top.source, line_of(node), path,
                                f"{text!r} would be served as {stem}.wasm, as {served[stem]!r} already is")
        served[stem] = text
        out.append(text)
    return tuple(out)


def parse_mesh(text: str, source: str = "mesh.yaml") -> Mesh:
    """Parse and validate a mesh file; `RegistryError` names the line and field of the first problem."""
    root = compose(text, source)
    if root is None:
        raise RegistryError(source, 0, "", "the mesh file is empty (no document)")
    top = Fields(root, "", source, _TOP)
    for key, wanted in (("apiVersion", API_VERSION), ("kind", KIND)):
        if top.has(key) and top.string(key) != wanted:
            top.fail(top.value_node(key), key, f"must be {wanted!r}, got {top.string(key)!r}")
    namespaces = _namespaces(top)
    services = _services(top, namespaces)
    entries = _entries(top, namespaces)
    deployments = _deployments(top, namespaces, _Resolver(services, [e for e, _ in entries]))
    _check_entry_endpoints(entries, deployments)
    expectations = _expectations(top, _Resolver(services, [e for e, _ in entries]), deployments)
    paths = tuple(text for _, _, text in top.string_list("istioConfig"))
    return Mesh(tuple(namespaces.values()), tuple(services), tuple(deployments), tuple(e for e, _ in entries),
                expectations, paths, wasm_modules=_wasm_modules(top))
