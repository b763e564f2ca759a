"""The Cython transport on its own: point-to-point calls, request sets, the broadcasts (tree,
chain, single copy and its fallback), and one message larger than 2 GiB (MPI's int count
limit), which the large-count calls carry whole.
usage: transport.py [big]"""
import errno
import sys

import numpy as np
from mpi4py import MPI

import _common as c
from fastring._transport import (Requests, Tag, Transport, array_address, chain_broadcast,
                                 single_copy_broadcast, tree_broadcast)
from fastring._transport.testing import irecv, isend, recv, send, set_pid

t = Transport(MPI.COMM_WORLD)
R, N = t.rank, t.size
right, left = (R + 1) % N, (R - 1) % N

# blocking send/recv around the ring (even ranks send first so that nothing deadlocks)
out = np.full(1000, R, np.int32)
got = np.empty(1000, np.int32)
if N > 1:
    if R % 2 == 0:
        send(t, array_address(out), out.nbytes, right)
        recv(t, array_address(got), got.nbytes, left)
    else:
        recv(t, array_address(got), got.nbytes, left)
        send(t, array_address(out), out.nbytes, right)
    c.check_close("send/recv", got, np.full(1000, left), 0)

# isend/irecv into a request set, completed together; testall then reports completion
reqs = Requests()
bufs = [np.empty(10, np.float64) for _ in range(N)]
payload = np.arange(10, dtype=np.float64) + 100 * R
for peer in range(N):
    irecv(t, reqs, array_address(bufs[peer]), bufs[peer].nbytes, peer)
for peer in range(N):
    isend(t, reqs, array_address(payload), payload.nbytes, peer)
if len(reqs) != 2 * N:
    c.fail(f"request set holds {len(reqs)} requests, expected {2 * N}")
reqs.waitall()
for peer in range(N):
    c.check_close(f"isend/irecv from {peer}", bufs[peer], np.arange(10) + 100 * peer, 0)
if len(reqs) != 0 or not reqs.testall():
    c.fail("waitall did not empty the request set")

# sendrecv around the ring
got = np.empty(1000, np.int32)
t.sendrecv(array_address(out), out.nbytes, right, array_address(got), got.nbytes, left, Tag.TESTING)
c.check_close("sendrecv", got, np.full(1000, left), 0)

# the three broadcasts, from every root, at sizes that split unevenly (odd byte counts, a
# share that is not whole cache lines, more segments than one, a partial last segment)
if t.enable_single_copy() != (N > 1):  # the test ranks share one host, as root may
    c.fail(f"single copy enabled={t.single_copy} on {N} rank(s) of one host "
           "(does this host forbid process_vm_readv?)")
for nbytes in (0, 1, 63, 4097, 300_001, 2_000_003):
    for root in range(N):
        expected = (np.arange(nbytes) * 7 + root).astype(np.uint8)
        for how in ("tree", "chain", "single copy", "single copy again"):
            buf = expected.copy() if R == root else np.full(nbytes, 0xEE, np.uint8)
            if how == "tree":
                tree_broadcast(t, array_address(buf), nbytes, root)
            elif how == "chain":
                chain_broadcast(t, array_address(buf), nbytes, root, 65536)
            elif N > 1:  # twice: the second call splits the bytes by the first one's speeds
                if single_copy_broadcast(t, array_address(buf), nbytes, root) != 0:
                    c.fail(f"single copy broadcast of {nbytes} failed")
            else:
                continue
            if not np.array_equal(buf, expected):
                bad = np.flatnonzero(buf != expected)
                c.fail(f"{how} broadcast of {nbytes} B from {root}: {bad.size} wrong bytes, first at {bad[0]}")
for what, call in [("root outside", lambda: tree_broadcast(t, 0, 0, N)),
                   ("root negative", lambda: chain_broadcast(t, 0, 0, -1, 8)),
                   ("segment", lambda: chain_broadcast(t, 0, 0, 0, 0)),
                   ("single copy root", lambda: single_copy_broadcast(t, 0, 0, N)),
                   ("single copy bytes", lambda: single_copy_broadcast(t, 0, -1, 0))]:
    try:
        call()
    except ValueError:
        pass
    else:
        c.fail(f"broadcast with a bad {what} did not raise ValueError")
if N > 1:
    # A copy that fails (here: the root's process id made wrong on one reader) is reported to
    # every rank, the bytes arrive anyway by messages, and single copy goes off everywhere.
    if R == N - 1:
        set_pid(t, 0, c.pid_of_no_process())
    expected = np.arange(100_000, dtype=np.uint8)
    buf = expected.copy() if R == 0 else np.zeros_like(expected)
    failed = single_copy_broadcast(t, array_address(buf), buf.nbytes, 0)
    if failed != errno.ESRCH or t.single_copy or not np.array_equal(buf, expected):
        c.fail(f"failed single copy: errno {failed}, still on {t.single_copy}, "
               f"bytes right {np.array_equal(buf, expected)}")
    try:
        single_copy_broadcast(t, array_address(buf), buf.nbytes, 0)
    except ValueError:
        pass
    else:
        c.fail("single copy broadcast ran after it was switched off")
    if t.enable_single_copy() is not True:  # the probe finds the real process ids again
        c.fail("single copy could not be enabled again")
    t.disable_single_copy()
    if t.single_copy:
        c.fail("disable_single_copy left it on")

if len(sys.argv) > 1 and sys.argv[1] == "big" and N > 1:
    nbytes = 2**31 + 4096  # past INT_MAX bytes
    send_buf = np.empty(nbytes, np.uint8)
    send_buf[:4096] = R + 1
    send_buf[-4096:] = R + 7
    recv_buf = np.zeros(nbytes, np.uint8)
    t.sendrecv(array_address(send_buf), nbytes, right, array_address(recv_buf), nbytes, left, Tag.TESTING)
    del send_buf
    if not (np.all(recv_buf[:4096] == left + 1) and np.all(recv_buf[-4096:] == left + 7)):
        c.fail(f"2 GiB+ message arrived wrong: head {recv_buf[:4]}, tail {recv_buf[-4:]}")
t.free()
c.done("transport")
