"""The Cython transport on its own: point-to-point calls, request sets, and one message
larger than 2 GiB (MPI's int count limit), which the large-count calls carry whole.
usage: transport.py [big]"""
import sys

import numpy as np
from mpi4py import MPI

import _common as c
from fastring._transport import Requests, Transport, array_address

t = Transport(MPI.COMM_WORLD)
R, N = t.rank, t.size
right, left = (R + 1) % N, (R - 1) % N

# blocking send/recv around the ring (even ranks send first so that nothing deadlocks)
out = np.full(1000, R, np.int32)
got = np.empty(1000, np.int32)
if N > 1:
    if R % 2 == 0:
        t.send(array_address(out), out.nbytes, right, 11)
        t.recv(array_address(got), got.nbytes, left, 11)
    else:
        t.recv(array_address(got), got.nbytes, left, 11)
        t.send(array_address(out), out.nbytes, right, 11)
    c.check_close("send/recv", got, np.full(1000, left), 0)

# isend/irecv into a request set, completed together; testall then reports completion
reqs = Requests()
bufs = [np.empty(10, np.float64) for _ in range(N)]
payload = np.arange(10, dtype=np.float64) + 100 * R
for peer in range(N):
    t.irecv(reqs, array_address(bufs[peer]), bufs[peer].nbytes, peer, 12)
for peer in range(N):
    t.isend(reqs, array_address(payload), payload.nbytes, peer, 12)
if len(reqs) != 2 * N:
    c.fail(f"request set holds {len(reqs)} requests, expected {2 * N}")
reqs.waitall()
for peer in range(N):
    c.check_close(f"isend/irecv from {peer}", bufs[peer], np.arange(10) + 100 * peer, 0)
if len(reqs) != 0 or not reqs.testall():
    c.fail("waitall did not empty the request set")

# sendrecv around the ring
got = np.empty(1000, np.int32)
t.sendrecv(array_address(out), out.nbytes, right, array_address(got), got.nbytes, left, 13)
c.check_close("sendrecv", got, np.full(1000, left), 0)

if len(sys.argv) > 1 and sys.argv[1] == "big" and N > 1:
    nbytes = 2**31 + 4096  # past INT_MAX bytes
    send = np.empty(nbytes, np.uint8)
    send[:4096] = R + 1
    send[-4096:] = R + 7
    recv = np.zeros(nbytes, np.uint8)
    t.sendrecv(array_address(send), nbytes, right, array_address(recv), nbytes, left, 14)
    del send
    if not (np.all(recv[:4096] == left + 1) and np.all(recv[-4096:] == left + 7)):
        c.fail(f"2 GiB+ message arrived wrong: head {recv[:4]}, tail {recv[-4:]}")
t.free()
c.done("transport")
