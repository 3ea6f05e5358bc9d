"""Serving the policy over HTTP and learning online from what users do with it.

  step.py        the compiled device programs: bucketed prefill, slot insert, one decode step
  engine.py      continuous batching over fixed decode slots; weights swapped between steps
"""
