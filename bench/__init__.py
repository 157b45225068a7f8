"""hare bench."""
