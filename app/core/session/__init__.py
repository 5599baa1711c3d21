"""The one owner of a sweep, above the verdict: a front end builds a ``SweepRequest`` (request),
``prepare`` checks it once and ``run`` yields its events (sweep), ``dispatch`` hands each event to
its handler (events); the adaptive sweep (adaptive) and the confirm run of a verdict's pick
(confirm) live here too. Imported by module, so that a front end loads only what it uses."""
