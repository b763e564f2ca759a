"""init compares the settings that decide which messages the ranks exchange before anything
else: for each case, rank r's environment gets the r-th of the comma-separated values; a
differing or invalid value must fail init on every rank at once (FastringError naming the
variable and the ranks, ValueError on the rank whose value is invalid), and the next init with
agreeing settings must work."""
import os

import numpy as np

import _common as c
import fastring

R, N = c.RANK, c.SIZE
CASES = [
    # variable, one value per rank (the last repeats), what every rank's error must name
    ("FASTRING_ALGORITHM", ["ring", "mpi"], "FASTRING_ALGORITHM differs between ranks"),
    ("FASTRING_SHM", ["1", "0"], "FASTRING_SHM differs between the ranks of one host"),
    ("FASTRING_FUSION_THRESHOLD", ["1048576", "1048576", "65536"],
     "FASTRING_FUSION_THRESHOLD differs between ranks"),
    ("FASTRING_ALGORITHM", ["auto", "bogus"], "rank 1: FASTRING_ALGORITHM='bogus' is not one of"),
]

for variable, values, expected in CASES:
    mine = values[min(R, len(values) - 1)]
    os.environ[variable] = mine
    try:
        fastring.init()
        c.CHECKS.fail(f"init started although {variable} was {values} across ranks")
        fastring.shutdown()
    except fastring.FastringError as e:
        if expected not in str(e):
            c.CHECKS.fail(f"{variable} {values}: the error does not say {expected!r}: {e}")
        if "differs" in expected:
            owners = [r for r in range(N) if values[min(r, len(values) - 1)] == values[-1]]
            named = f"rank{'s' if len(owners) > 1 else ''} {', '.join(map(str, owners))}"
            if named not in str(e):
                c.CHECKS.fail(f"{variable} {values}: the error does not name {named}: {e}")
    except ValueError as e:
        if mine != "bogus" or "'bogus'" not in str(e):
            c.CHECKS.fail(f"{variable} {values}: rank {R} raised ValueError for its valid value: {e}")
    if fastring.is_initialized():
        c.CHECKS.fail(f"{variable} {values}: fastring is initialized after a failed init")
    del os.environ[variable]

fastring.init()
got = fastring.allreduce(np.arange(1000, dtype=np.int64) * (R + 1), op=fastring.Sum)
if not np.array_equal(got, np.arange(1000, dtype=np.int64) * (N * (N + 1) // 2)):
    c.CHECKS.fail("the allreduce after the failed inits is wrong")
c.done("config agreement")
