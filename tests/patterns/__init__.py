"""Generated stepping programs, their oracle and their runners (issue 26)."""
