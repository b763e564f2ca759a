"""The bottom layer: configuration, the dtype and op tables, errors, the result pool, tensors
in and out (DLPack), device tensors, compression formats, the meaning of an allreduce's work,
and the Runtime (communicator and topology). Nothing here imports from a layer above."""
