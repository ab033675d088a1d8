"""The identity's sans-IO core: `cert_lifecycle` (when to sign, rotate, retry, give up a certificate),
`rotation` (the schedule and backoff), `sds_state` (SDS subscriptions and their versions), `secrets` (the
secrets held and parsed) and `sds_wire` (SDS's messages, byte for byte Envoy's). No sockets, threads or event
loop here: the package's top level performs what these decide. Imports nothing.
"""
