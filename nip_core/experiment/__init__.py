"""Learning experiments: arms from one config, per-episode rows, bootstrap statistics, report."""
