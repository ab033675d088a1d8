"""The XDS proxy's sans-IO core: `session` (what to do with each message of a stream), `messages` (the heads
of the discovery messages, read and written without Envoy's modules) and `routing` (type URL to owner).
No sockets or event loop here: the package's top level (`proxy`, `upstream`) relays the bytes. Imports nothing.
"""
