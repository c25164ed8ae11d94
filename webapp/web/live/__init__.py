"""The server's live runs: the runs this process executes, and those it follows.

`runs` starts, stops and resumes runs, one chat at a time (`chat_locks`);
`run_state` is what a page reads of one; with other processes on PostgreSQL,
`cluster` holds the leases and the event log, `followers` replays another
process's runs and `lease_keeper` renews and takes over.
"""
