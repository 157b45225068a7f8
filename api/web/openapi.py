"""GET /openapi.json: this server's API for its task, written from the one route table (api/web/routes.py
ROUTES). Each route's path and methods come from the table; each operation from the module that owns the
route, beside its handler (the protocols in api/web/protocols/, the operational routes in routes.py), built
with api/web/openapi_parts.py from the tables the code enforces. A route whose owner states no operation for
this task (sparse routes on a dense model, ranking routes on an embedding model) answers 404 naming the task,
and the document leaves it out.
"""

from __future__ import annotations

from typing import Any

from api.web.errors import OPENAI_TYPE_NAMES
from api.web.openapi_parts import Shapes
from api.web.protocols import cohere_embed, kserve
from api.web.routes import ROUTES, Documented
from api.web.state import Resources

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "type"],
    "properties": {"error": {"type": "string"}, "type": {"type": "string"}, "error_type": {"type": "string"}},
}
# api/web/errors.py's body on OpenAI's routes.
OPENAI_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "enum": OPENAI_TYPE_NAMES},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def paths(res: Resources) -> dict[str, Any]:
    """Per route of the table, in its order: the operations its owner states for this server's task."""
    shapes = Shapes(res, cohere_embed.width(res))
    found: dict[str, Any] = {}
    for route in ROUTES:
        item: dict[str, Any] = {}
        for method, describe in route.operations.items():
            operation = describe(shapes)
            if operation is not None:
                item[method.lower()] = operation
        if item:
            found[route.path_format] = {**item, **_path_parameters(route, res)}
    return found


def _path_parameters(route: Documented, res: Resources) -> dict[str, Any]:
    # The model's name and KServe's version each take one value on this server; any other answers 404.
    # ({model:path} may hold slashes: a model name may.)
    only = {"name": res.model_name, "model": res.model_name, "version": kserve.VERSION}
    named = [
        {"name": name, "in": "path", "required": True, "schema": _one_of(only.get(name))}
        for name in route.param_convertors
    ]
    return {"parameters": named} if named else {}


def _one_of(value: str | None) -> dict[str, Any]:
    return {"type": "string", "enum": [value]} if value is not None else {"type": "string"}


def spec(res: Resources) -> dict[str, Any]:
    """The OpenAPI 3.1 document for the server `res` describes (its task, limits and model)."""
    security: list[dict[str, list[str]]] = [{"bearer": []}] if res.settings.api_key else []
    return {
        "openapi": "3.1.0",
        "info": {"title": f"hare · {res.model_name}", "version": "1", "description": f"Serves {res.task.name}."},
        "paths": paths(res),
        "security": security,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA, "OpenAIError": OPENAI_ERROR_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
