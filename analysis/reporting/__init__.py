"""What an analysis says: the verdicts on the papers' claims, the conventions
each quantity follows, the figures, the TensorBoard events and the report."""
