"""Per-task pre- and post-processing: pure functions over numpy arrays and tokenizer encodings.

Nothing here imports onnxruntime, Starlette or torch; the server and the optimizer both use it.
"""
