# cython: language_level=3
"""The MPI tags of fastring's messages: the enum `Tag`, declared (and documented) in tags.pxd."""
