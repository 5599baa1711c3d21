"""Watch a running llama-server and say which draft width its real traffic wants.

client (the four GET endpoints read, the API key), metrics (the Prometheus page parsed),
window (counter deltas over a window; a restart or reset starts a new one), costs (which cost
record may price this server: the one matching predicate), predict (speedup of off and every K
with intervals from the counts; the recommendation), watcher (the loop the CLI and the window
drive; the watch record). A layer beside app.core.verdict: it reads records and analysis, never
a session, and never changes the server it watches."""
