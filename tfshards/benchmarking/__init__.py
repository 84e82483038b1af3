"""Measuring tfshards against hand-written pipelines: baselines, timing, the `bench` sweep."""
