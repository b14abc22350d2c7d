"""Ray Tune sweeps: plan (validation, concurrency), tuner (space, schedulers, trials), results (table, CSV, plot)."""
