"""The process machinery of `hare serve`: the command that execs gunicorn, gunicorn's config, the worker
class with its own accept loop, the accept loop's raw-socket refuser, and the images' health check. It hosts
the app (api/web/) in processes; nothing below imports it.
"""
