"""The client protocols hare speaks, one short module each, all through `base.infer` (admission, parse, run)."""
