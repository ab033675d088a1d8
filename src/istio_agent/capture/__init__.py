"""Traffic capture: istio-iptables and its nftables twin (a plain library, also used by `pilot-agent istio-iptables`).

`config` holds the flags and environment as one value, `rules` turns it into
a rule list (sans-IO), `iptables_text` / `nft` render it, `validation` refuses
any value that could add an argument to a rule, and `apply` / `netns` /
`procs` / `hostfacts` are the I/O edges (iptables-restore or nft, network
namespaces, the host's addresses and resolvers). Never imports the agent.
"""
