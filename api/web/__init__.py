"""The HTTP face: the Starlette app, its routes and client protocols, request bodies, the error table and its
answers, metrics, the OpenAPI page and the exposure controls. It stands on the engine (api/engine/) and turns
HTTP into engine calls and engine results and errors into HTTP answers.
"""
