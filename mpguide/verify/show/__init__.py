"""What a page shows from a record: figures, their overlapping series, verdict tables."""
