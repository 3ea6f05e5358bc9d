"""Models: the policy decoder, checkpoint import, and the sentence encoder.

Submodules are imported by name (`rlcode.models.encoder`), so loading one model
never imports the others.
"""
