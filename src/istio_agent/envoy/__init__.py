"""Envoy: its bootstrap, its command line, and the component that runs it (`supervisor.EnvoySupervisor`).

`options.EnvoyOptions` is what the options resolver builds; `bootstrap/`,
`argv` and `drain` are pure (the bootstrap as data, the argv list, the drain
decisions); `supervisor`, `process` and `admin` are the I/O edges (writing the
bootstrap, the child process, the admin API).
"""
