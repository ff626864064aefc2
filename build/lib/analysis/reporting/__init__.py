"""What an analysis says: the verdicts on the papers' claims, the conventions each
quantity follows, the figures and the TensorBoard events (the report of a whole
output folder is the command's: `analysis.cli.report`)."""
