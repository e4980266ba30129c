"""The attention contract shared by the models and the worker (see base.py)."""
