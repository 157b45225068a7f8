"""hare admin_ui."""
