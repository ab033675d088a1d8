"""The product's Kubernetes API clients: exactly two, and why two.

- `client` (with `yamlsubset` for kubeconfigs and `keepalive` for kept-alive
  connections): synchronous, builtins only (no `http.client`, no PyYAML, no
  dataclasses or typing at run time), one request of any method, path and body
  per call over a connection the caller may open itself (`connect`). The
  `istio-cni` plugin is exec'd for every pod and reads a pod through it on its
  ADD path, where an HTTP library's import is paid on each pod's start (here,
  `pod_api`'s imports, lightkube and httpx, took ~165 ms and ~20 MB of RSS in
  a fresh interpreter; `client`'s ~20 ms and ~2 MB). install-cni's fast path
  sends the same requests over kept-alive connections, and the local node (a
  kubelet's GET and status PATCH, from inside its network namespace) uses it
  too.
- `pod_api` (on lightkube, with `access` for the in-cluster settings): asyncio,
  for the repair controller inside install-cni, which lists pods, watches them
  with bookmarks, resumes and re-lists, patches and deletes them: a long-lived
  streaming client that a well-kept library gives, in a process that pays its
  import once (`benchmarks/bench_kube_clients.py` chose lightkube).

This `__init__` imports nothing: `istio-cni` imports `kube.client` on its per-pod path.
"""
