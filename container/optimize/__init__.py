"""`hare optimize`: each stage is a function from one file to another; `pipeline.py` composes them."""
