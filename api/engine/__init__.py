"""The inference engine: texts in, model rows out, within a worker and across the machine's cores.

Admission, tokenizing, the length-bucketed queue, batching, the model threads, the machine-wide core pool and
the model call. It knows nothing of HTTP (no Starlette here; tests/test_layers.py checks): it raises its own
errors (errors.py), takes plain callables for what it reports, and the web room (api/web/) maps its errors
to statuses.
"""
