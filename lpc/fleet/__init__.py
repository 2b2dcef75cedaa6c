"""The fleet: many engine instances behind a router, replayed together (`lpc fleet`).

Instances share nothing but the router: each has its own prefix cache and evictor, and the
router sees only what a production router sees at a request's arrival (queued tokens, the
conversation, each instance's cached prefix). One instance under any router is exactly the
single-instance replay of `lpc ab`. Independent replays fan out on Ray when it is installed
(`lpc.fleet.fanout`), serially otherwise; so does the daily job's reading of a fleet's request
logs (`lpc.fleet.request_logs`, which also writes such logs from a trace).
"""
