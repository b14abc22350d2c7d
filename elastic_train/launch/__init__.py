"""What runs on the driver: the run context, preflight, trainer construction, fit, summary and evaluation."""
