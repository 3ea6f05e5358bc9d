"""Meshes and processes: logical-axis sharding rules, sharded init, `jax.distributed` runs.

  sharding.py     meshes from config, the rules table, `constrain`, sharded initialisation
  distributed.py  one run over N processes: set-up, per-process meshes, global batches
"""
