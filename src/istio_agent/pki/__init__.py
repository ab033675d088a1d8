"""Keys, CSRs, certificate issuing and inspection, shared by the agent and istiod-local."""
