"""Configs: `configs/*.py` files (ml_collections) validated against one typed schema.
"""
