"""istiod-local's xDS: a YAML service registry turned into sidecar config, served over ADS.

Layers, each usable alone:

* `registry.parse_registry(text, source)` -> `Registry` (pure; `RegistryError` names line and field);
  `watcher.RegistryWatcher` reloads the file and keeps the last good registry;
* `mesh.build_snapshot` -> `MeshSnapshot`: registry plus the pods whose proxies connected, indexed;
* `generators`: pure (snapshot, proxy) -> Envoy resources, chosen per proxy by its `GENERATOR` metadata
  (`sidecar` now; a proxyless `grpc` generator registers into the same `GeneratorSet`);
* `sessions`: sans-IO SotW and Delta ADS state machines;
* `ads.AdsServer`: the grpc.aio adapter (`register(server)` adds the service to any grpc.aio server,
  `update_registry(registry)` pushes); `service.XdsService` wires file, watcher, ADS and token auth
  together for `istiod-local serve --registry`.
"""

from __future__ import annotations

from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.registry import Registry, RegistryError, parse_registry
from istiod_local.controlplane.xds.service import XdsOptions, XdsService
from istiod_local.controlplane.xds.watcher import RegistryWatcher

__all__ = ["AdsServer", "Registry", "RegistryError", "RegistryWatcher", "XdsOptions", "XdsService", "parse_registry"]
