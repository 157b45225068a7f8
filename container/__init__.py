"""Everything that turns a model folder into a ready appliance: optimizer, runtime, CLI, deployment files."""
