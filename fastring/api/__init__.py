"""The public functions: argument checks at call time, one Request per collective, submitted
to the engine (`process`: init and the rank layout; `allreduce`; `collectives`: the others)."""
