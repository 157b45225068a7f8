"""hare api."""
