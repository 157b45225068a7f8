"""The client protocols hare speaks, one short module each, all through `base.infer` (admission, parse, run);
each also states its routes' OpenAPI operations beside its handlers (`*_operation`, named per route in
api/web/routes.py's table and assembled by api/web/openapi.py)."""
