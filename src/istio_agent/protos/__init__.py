"""The Istio API messages the project speaks, from our own `.proto` files (upstream's packages and field
numbers), their generated modules (kept in sync by a test), and `typeurls`, the one list of xDS type URLs.
"""
