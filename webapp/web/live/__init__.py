"""The server's live runs: the runs this process executes, and those it follows.

`runs` starts, stops and resumes runs, one chat at a time (`chat_locks`);
`run_state` is what a page reads of one (its phase and log), `reply` the plain
record of what it produced. The helpers depend on narrow protocols (`host`):
`pauses` keeps runs waiting for a tool approval, `recovery` takes owed runs up
again. Whatever differs between one process and several is the cluster's
(`webapp.stores.cluster`): `local_cluster` for one process alone, the PostgreSQL
one (`webapp.stores.postgres_cluster`) with others, where `followers` replays
another process's runs and `lease_keeper` renews and takes over. Nothing here
imports the rest of `webapp.web`: the web draws what the runs publish.
"""
