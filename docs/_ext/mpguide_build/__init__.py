"""What only the docs build needs: the Sphinx extension, the page check, GPU references, the version matrix,
the reader download and the small programs of the nox sessions. Not part of the installed package;
``conf.py`` puts ``docs/_ext`` on ``sys.path``. Depends on :mod:`mpguide` and :mod:`mpguide.verify`, never
the other way round."""
