"""schemathesis hooks for tests/test_openapi.py (loaded through SCHEMATHESIS_HOOKS).

A KServe request tensor's shape must count its data's elements (api/web/protocols/kserve.py refuses it with
422 otherwise): a rule across two fields that JSON Schema cannot state, so the fuzzer's bodies would nearly
always break it and never reach the model. This hook states it before each call: every tensor whose shape is a list of
non-negative integers and whose data is a list gets the shape [number of elements]. schemathesis revalidates a
case a hook changed, so a negative case stays negative only where something else is wrong with it; the
refusal of a shape that miscounts is tested directly (tests/test_api_protocols.py). A classifier's pair tensors,
"text" and "text_pair", must hold as many strings each (one per pair), another such rule: the longer is cut to
the shorter's count first. A classifier's `raw_scores` true asks for the logits, which a `function_to_apply`
other than "none" contradicts (422, tested in tests/test_api_predict.py): raw_scores goes where both come.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    # before_call, not map_body: the coverage phase's cases skip the map hooks; every case is sent
    body = case.body if isinstance(case.body, dict) else {}
    for where in (body, body.get("parameters")):  # a parameter may sit at the body's root too
        if (
            isinstance(where, dict)
            and where.get("raw_scores") is True
            and where.get("function_to_apply") not in (None, "none")
        ):
            where.pop("raw_scores")
    tensors = (
        case.body.get("inputs") if case.operation.path.endswith("/infer") and isinstance(case.body, dict) else None
    )
    tensors = [t for t in tensors if isinstance(t, dict)] if isinstance(tensors, list) else []
    pair = [t["data"] for t in tensors if t.get("name") in ("text", "text_pair") and isinstance(t.get("data"), list)]
    if len(pair) == 2:
        count = min(map(len, pair))
        for data in pair:
            del data[count:]
    for tensor in tensors:
        if not isinstance(tensor.get("data"), list):
            continue
        shape = tensor.get("shape")
        if isinstance(shape, list) and all(type(d) in (int, float) and d >= 0 for d in shape):
            tensor["shape"] = [len(tensor["data"])]
