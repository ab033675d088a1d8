"""The live view of a running mesh (`istiod-local up`): pods, services, istiod-local, recent events.

API (stable; `istiod-local up` uses it):

    from istiod_local.meshview import MeshEvent, ViewTarget, run_view, STATS_INCLUSION_SUFFIXES

    targets = lambda: [ViewTarget(name=p.name, namespace="default", ip=p.ip, netns=p.netns,
                                  mode="sidecar", service_account="echo") for p in pods]
    events: queue.Queue[MeshEvent | str] = queue.Queue()    # or a callable returning new events
    stop = threading.Event()
    threading.Thread(target=run_view, args=(targets, "127.0.0.1:15014", stop, events),
                     kwargs={"istiod_netns": node.plan.netns}, daemon=True).start()
    events.put("mesh.yaml: echo replicas 2 -> 3")            # shown under "recent events"
    ...
    stop.set()

* `targets()` is called every round (once a second), so pods added or removed show up at once.
  `ViewTarget.netns` is the pod's `ip netns` name (or a path; None: this process's namespace);
  `mode` is "sidecar", "proxyless" or "none". A proxyless pod has no Envoy to say which certificate
  it serves: give `cert_file` (its OUTPUT_CERTS `cert-chain.pem` on this host, e.g.
  `<pod dir>/var/lib/istio/data/cert-chain.pem`) and the view reads identity and expiry from it.
* `istiod_monitoring`: istiod-local's `--monitoring-addr` (host:port), read from inside
  `istiod_netns` when given (on the local node istiod-local runs in the node namespace); None: no
  istiod line.
* `out` (default stdout): a terminal gets the rich live view (`live=True/False` forces it),
  anything else one line per change ("pod default/echo-1 ready", "service echo.default: traffic ..."),
  the events given included: a caller that hands its events to the view should not print them too.
* Request rates, errors and latencies come from the clients' Envoys' per-cluster stats, which
  Istio's default stats inclusion list drops: put `STATS_INCLUSION_SUFFIXES` in each sidecar's
  ProxyConfig `proxyStatsMatcher.inclusionSuffixes`.

`MeshWatcher` runs the same rounds one `step()` at a time (tests, callers with their own loop).
Layout: `stats.py` (parsing, rates, percentiles), `model.py` (samples, window, views, changes),
`render.py` (rich and plain), `netns.py` + `collector.py` (the I/O edge), `run.py` (the loop).
"""

from __future__ import annotations

from istiod_local.meshview.model import MeshEvent, MeshView, ViewTarget
from istiod_local.meshview.run import MeshWatcher, run_view
from istiod_local.meshview.stats import STATS_INCLUSION_SUFFIXES

__all__ = ["STATS_INCLUSION_SUFFIXES", "MeshEvent", "MeshView", "MeshWatcher", "ViewTarget", "run_view"]
