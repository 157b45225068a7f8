"""`hare optimize`: each stage a function (`stages.py`) from files to files; `pipeline.py` composes them."""
