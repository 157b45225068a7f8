"""GET /openapi.json and GET /docs: this server's API for its task, from the same parameter tables the
request parser uses (so the documentation cannot drift from what is accepted). The docs page is plain
HTML with no external assets: the appliance often runs offline."""

from __future__ import annotations

import html
from typing import Any

from api.schemas import COMMON
from tasks.base import TaskSpec

ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _inputs(task: TaskSpec) -> dict[str, Any]:
    if task.pairs:
        return {
            "type": "object",
            "required": ["query"],
            "properties": {
                "query": {"type": "string"},
                "documents": {"type": "array", "items": {"type": "string"}},
                "texts": {"type": "array", "items": {"type": "string"}, "description": "alias of documents"},
            },
        }
    return {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


def spec(task: TaskSpec, model_name: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document for a server answering `task`."""
    parameters = {name: {"description": help} for name, help in {**task.parameters, **COMMON}.items()}
    errors = {
        "400": _json(ERROR, "empty input"),
        "413": _json(ERROR, "input or body too long (truncate false, or a size cap)"),
        "422": _json(ERROR, "malformed JSON, wrong type, unknown parameter or value; the message names the field"),
        "429": _json(ERROR, "the worker's queue is full, or the client's rate limit is spent: see Retry-After"),
        "503": _json(ERROR, "loading or draining"),
    }
    paths: dict[str, Any] = {
        "/predict": {
            "post": {
                "summary": f"{task.name}: Hugging Face pipeline-compatible answers",
                "description": "A single string answers in the single-input shape; a list, one answer per string. "
                "Headers: x-compute-time (seconds), x-compute-type, x-compute-characters, x-compute-tokens, "
                "server-timing, and x-truncated when an input was cut.",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["inputs"],
                                "properties": {
                                    "inputs": _inputs(task),
                                    "parameters": {"type": "object", "properties": parameters},
                                },
                            }
                        }
                    },
                },
                "responses": {"200": {"description": "the answer"}, **errors},
            }
        },
        "/health": {"get": {"summary": "liveness", "responses": {"200": _json({"type": "object"}, "alive")}}},
        "/ready": {
            "get": {
                "summary": "readiness: model loaded and warm, not draining",
                "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}},
            }
        },
        "/info": {"get": {"summary": "model, variant, validation figures, workers, versions", "responses": {}}},
        "/metrics": {"get": {"summary": "Prometheus metrics, merged across workers", "responses": {}}},
    }
    if task.embeddings:
        paths["/v1/embeddings"] = {
            "post": {
                "summary": "OpenAI-compatible embeddings",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["input"],
                                "properties": {
                                    "input": _inputs(task),
                                    "model": {"type": "string"},
                                    "encoding_format": {"enum": ["float", "base64"]},
                                    "dimensions": {"type": "integer"},
                                },
                            }
                        }
                    },
                },
                "responses": {"200": {"description": "the embeddings"}, **errors},
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": f"hare · {model_name}", "version": "1", "description": f"Serves {task.name}."},
        "paths": paths,
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "type": {"type": "string"}},
                }
            }
        },
    }


def docs_page(document: dict[str, Any]) -> str:
    """A self-contained HTML page listing the routes and /predict's parameters."""
    e = html.escape
    rows = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            rows.append(f"<tr><td><code>{method.upper()} {e(path)}</code></td><td>{e(op.get('summary', ''))}</td></tr>")
    params = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    items = params["properties"]["parameters"]["properties"]
    plist = "".join(f"<li><code>{e(k)}</code>: {e(v['description'])}</li>" for k, v in items.items())
    title = e(document["info"]["title"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body style='font-family:sans-serif;max-width:60em;margin:2em auto'><h1>{title}</h1>"
        f"<p>{e(document['info']['description'])} Machine-readable: <a href='/openapi.json'>/openapi.json</a>.</p>"
        f"<table>{''.join(rows)}</table><h2>/predict parameters</h2><ul>{plist}</ul>"
        "<h2>Try it</h2><pre>curl -i -X POST localhost:8080/predict -H 'content-type: application/json' "
        '-d \'{"inputs": "I like you. I love you"}\'</pre></body></html>'
    )
