"""Launchers: scripts that start `attnmt train` processes on a machine, a cluster or a cloud.

Each is run as `python launch/<name>.py ... [--dry-run]`. They only start processes; the
processes join one JAX job themselves (src/attnmt/parallel/distributed.py). Nothing here
imports attnmt or JAX, so the launchers also work from a laptop without them installed.
"""
