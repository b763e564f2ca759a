"""Data-parallel training of a small MLP in plain JAX + optax over fastring.

Every rank draws its own shard of a synthetic regression problem, starts from rank 0's
parameters (broadcast_pytree), and runs a jitted train step whose gradients are averaged over
the ranks by one fused allreduce inside the compiled step (DistributedGradients, chained
before Adam). Rank 0 prints the loss averaged over ranks after every epoch; at the end every
rank checks that its parameters are bitwise identical to rank 0's.

Run:
    fastring-run -np 2 python examples/jax_train.py
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fastring.jax as fj


def init_mlp(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) / np.sqrt(fan_in),
                       "b": jnp.zeros(fan_out)})
    return params


def mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=25, help="steps per epoch")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    args = parser.parse_args()

    fj.init()
    rank, size = fj.rank(), fj.size()

    # The task: y = sin(x . a) + 0.1 noise; each rank its own samples of it.
    true_a = jax.random.normal(jax.random.PRNGKey(0), (8, 1))
    data_key = jax.random.PRNGKey(1 + rank)

    # Different starting points on every rank: broadcast_pytree makes them rank 0's.
    params = fj.broadcast_pytree(init_mlp(jax.random.PRNGKey(100 + rank), [8, 32, 32, 1]), root_rank=0)
    tx = optax.chain(fj.DistributedGradients(), optax.adam(3e-3))
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for epoch in range(args.epochs):
        total = 0.0
        for _ in range(args.steps):
            data_key, kx, kn = jax.random.split(data_key, 3)
            x = jax.random.normal(kx, (args.batch, 8))
            y = jnp.sin(x @ true_a) + 0.1 * jax.random.normal(kn, (args.batch, 1))
            params, opt_state, loss = train_step(params, opt_state, x, y)
            total += float(loss)
        epoch_loss = float(fj.allreduce(jnp.asarray(total / args.steps), op=fj.Average))
        losses.append(epoch_loss)
        if rank == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}", flush=True)

    # Replicas must end identical: compare every rank's parameter bytes with rank 0's.
    flat = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree_util.tree_leaves(params)])
    reference = np.asarray(fj.broadcast(jnp.asarray(flat), root_rank=0))
    identical = bool(np.array_equal(flat.view(np.uint32), reference.view(np.uint32)))
    all_identical = int(fj.allreduce(jnp.asarray(int(identical)), op=fj.Min)) == 1
    if rank == 0:
        print(f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}; replicas identical on all "
              f"{size} ranks: {all_identical}", flush=True)
    if not all_identical or not losses[-1] < losses[0]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
