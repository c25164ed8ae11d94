"""Chat with durable runs: an agent runtime plus a server-rendered chat UI."""
