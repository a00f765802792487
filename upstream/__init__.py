"""Runs Lightning's own tests with this project's precision plugins in place of Lightning's (see README.md)."""
