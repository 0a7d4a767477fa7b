"""``trajkit serve``: the agent behind an OpenAI-compatible chat completions API.

``settings`` (the server's own settings), ``protocol`` (requests, responses, chunks, errors),
``security`` (key, CORS, error middlewares), ``service`` (the agent: a fresh sandbox per request),
``stream`` (server-sent events), ``routes`` (the endpoints), ``recorder`` (``--record RUN_DIR``),
``app`` (the aiohttp application and its life). The command is in ``trajkit.plugins.serve``.
"""
