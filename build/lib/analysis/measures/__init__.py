"""The array mathematics of the analysis: pure functions over arrays (similarity
of representations, curvature by Lanczos, Fourier amplitudes, attention
distances, probes, corruptions, standard errors), each written from the
authors' code and tested against an independent reference. They know nothing of
models, files or tools."""
