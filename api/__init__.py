"""hare's server: three rooms on one floor, each importing only the rooms below it (tests/test_layers.py).

    process/   how it runs: `hare serve` (serve.py) execs gunicorn with gunicorn_conf.py; worker.py, the
               worker class with its own accept loop, whose pace while refusing is pace.py's and whose
               raw-socket refusals are refuser.py's; memory.py, what the workers may need of the memory;
               healthcheck.py, the images' HEALTHCHECK
    web/       the HTTP face: app.py (create_app, the lifespan that builds a worker's resources), routes.py,
               protocols/ (hf, openai, rerank, cohere_embed, tei, kserve), schemas.py (bodies), errors.py
               (the one status table and the one error answer), metrics.py, openapi.py (the document, from
               the route table; each route's owner writes its operation with openapi_parts.py), public.py, state.py
    engine/    inference, no HTTP: admission.py, pipeline.py (tokenize, queue, post-process), encoder.py,
               batching.py (with policy.py, lengthqueue.py, scheduler.py), cores.py (the machine-wide core
               pool), backend.py (the model call), errors.py (its errors, without statuses)
    config.py  the one Settings object, read by all three

The engine takes plain callables (the model call, metrics hooks, "has the client gone") and raises its own
errors; the web room turns HTTP into engine calls and every error into its status; the process room hosts
the app in processes. docs/architecture.md walks one request and one build through these modules.
"""
