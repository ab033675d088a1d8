"""`istiod-local up`: a whole mesh described by one file, run on a local node, kept in step, checked.

- `model.py`: the mesh file as frozen data; `parser.py`: the file's schema and
  `parse_mesh` (text in, model out, or an error naming the line and field);
- `planner.py`: from the model to pod specs, app command lines and
  istiod-local's registry (pure);
- `expect.py`: the check's probes, what the policies say each must give, and
  how an answer is read (pure);
- `apps.py`: the pods' apps (HTTP echo with next hops, TCP echo, background
  clients, the probe runner);
- `lock.py`, `runner.py`, `up.py`: the I/O edge (the run lock, the node, the
  file watch, the check's execution, the live view).

docs/MESH.md is the user's guide; examples/mesh.yaml the default mesh.
"""
