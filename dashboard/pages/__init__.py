"""The dashboard's pages: each module has ``PATH``, ``NAME``, ``layout(**query)`` and
``register(app)`` (its callbacks)."""
