"""Inference engines on a node's GPUs: found from the GPU's own processes, read each cycle.

The engine points' names and attributes are the contract in ``docs/accounts.md``.
"""
