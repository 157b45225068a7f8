"""The gated delta rule (Qwen3.5's linear-attention layers) with no loop over the sequence, for export.

transformers' `torch_chunk_gated_delta_rule` cuts the sequence into 64-token chunks and walks them in a Python
loop carrying a [key_dim, value_dim] state per head; the TorchScript exporter unrolls that loop at the
example's length, so the graph would answer wrongly at any other length. `loop_free` swaps in `gated_delta_rule`
while the export traces the model; PyTorch's reference (the gates') stays transformers' own function.

With no cache the initial state is 0. Per chunk c (positions i, j in it; G = cumsum of the log decays g
within the chunk; D[i, j] = exp(G_i - G_j) for i >= j, else 0, masked before the exp so it never overflows):

    U_c = T_c (beta V)_c,  W_c = T_c (beta K exp(G))_c,  T_c = (I + strictly_lower((beta K) K^T * D))^-1
    out_c = (Q K^T * D) U_c + (Q exp(G) - (Q K^T * D) W_c) S_c
    S_{c+1} = M_c S_c + R_c,  M_c = exp(G_last) I - K~^T W_c,  R_c = K~^T U_c,  K~ = K exp(G_last - G)

which is transformers' chunk loop written out (its U is `new_values`, its W `k_cumdecay`). T_c is built by
recursive doubling over blocks, [[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]] (6 levels for 64
rows, static sizes), and the states S_c by a Hillis-Steele scan over the chunks' affine maps (M_c, R_c): step
j composes the map of each chunk from the 2^j-th on with the one 2^j chunks before it, so
`scan_steps(max_length)` fixed steps (the bundle's tokenizer truncates there) cover every chunk at any length,
and a step with no chunk that far along works on empty tensors. Cost per head: O(T C d) within the chunks,
O(N log N d^3) for the scan (N = T / 64 chunks, d the head size).

Why blocked rather than one chunk the size of the sequence, with (I - L)^-1 = (I + L)(I + L^2)(I + L^4)...
(L strictly lower, hence nilpotent, so a fixed number of factors is exact at any length): that product is
exact algebra but its factors are not bounded. L^n[i, j] sums over every path from j to i, so with alike
keys, beta near 1 and slow decay (repeated text in a trained model) it grows like binomial(i - j, n) and the
answer is a cancellation of huge terms. Measured against the token-by-token recurrence in float64 (heads of
32): the product form misses by 2e2 at 37 tokens and overflows (NaN) at 200 in float32, and misses by 9e20 at
130 tokens in float64 (inf at 200); this blocked form is as close to it as transformers' own chunked
function (3.7e-6 at most, both) and within 5.4e-7 of that function, up to 600 tokens. The product form's
O(T^3 log T) per head would also cost more than the whole model past a few hundred tokens.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

CHUNK = 64  # transformers' chunk size: a chunk's own work is O(CHUNK^2 d), its share of the scan O(d^3 log N)
REFERENCE = "torch_chunk_gated_delta_rule"  # the function a gated-delta-rule layer calls, by its module's name


def scan_steps(max_length: int) -> int:
    """Scan steps that reach every chunk of a `max_length`-token sequence: a chunk's state composes the maps
    of all chunks before it (at most ceil(max_length / CHUNK) - 1 of them), 2^steps at most."""
    before = max(-(-max_length // CHUNK) - 1, 1)
    return (before - 1).bit_length()


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # transformers' l2norm (FLA's)


def _unit_lower_inverse(k_beta: torch.Tensor, key: torch.Tensor, cum: torch.Tensor) -> torch.Tensor:
    """(I + strictly_lower((k_beta key^T) * D))^-1 of each chunk, [rows, C, C] from [rows, C, d] and cum
    [rows, C], by recursive doubling: the diagonal blocks' inverses of size s give those of size 2s."""
    d = int(key.shape[-1])
    inverse = torch.ones_like(cum)[..., None, None]  # [rows, C, 1, 1]: a unit triangle's 1x1 blocks
    s = 1
    while s < CHUNK:
        pairs = CHUNK // (2 * s)
        kb = k_beta.reshape(-1, pairs, 2, s, d)
        k = key.reshape(-1, pairs, 2, s, d)
        g = cum.reshape(-1, pairs, 2, s)
        # The block below the diagonal: every row after every column, so its decays are all <= 1.
        below = (kb[:, :, 1] @ k[:, :, 0].transpose(-1, -2)) * torch.exp(g[:, :, 1, :, None] - g[:, :, 0, None, :])
        blocks = inverse.reshape(-1, pairs, 2, s, s)
        upper, lower = blocks[:, :, 0], blocks[:, :, 1]
        inverse = torch.cat(
            [torch.cat([upper, torch.zeros_like(upper)], -1), torch.cat([-(lower @ (below @ upper)), lower], -1)], -2
        )
        s *= 2
    return inverse.reshape(-1, CHUNK, CHUNK)


def _update(x: torch.Tensor, chunk: torch.Tensor, first: int, tail: torch.Tensor) -> torch.Tensor:
    """x with its chunks (axis 1, numbered by `chunk`) from `first` on replaced by `tail`, by one gather: the
    result's shape is x's, which keeps ONNX Runtime's symbolic shape inference (and with it the optimizer's
    fusions) simple."""
    source = torch.where(chunk < first, chunk, chunk + (chunk.shape[0] - first))
    return torch.cat([x, tail], 1).index_select(1, source)


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    steps: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' torch_chunk_gated_delta_rule (same arguments, shapes and answer) from a zero state, for
    sequences of up to CHUNK * (2^steps + 1) tokens, with every shape dynamic and no loop over the sequence."""
    if initial_state is not None or output_final_state:
        raise ValueError("the loop-free gated delta rule is for export without a cache (no state in or out)")
    dtype = query.dtype
    # Head counts and sizes are the model's, constants in the graph: each reshape is then one node, not a
    # dozen that compute its shape (a layer's graph had 1,150 nodes, most of them that).
    heads, key_heads, d, dv = (int(n) for n in (value.shape[2], key.shape[2], key.shape[3], value.shape[3]))
    if heads != key_heads:  # grouped value heads: each query/key head serves heads // key_heads of them
        query = query.repeat_interleave(heads // key_heads, dim=2)
        key = key.repeat_interleave(heads // key_heads, dim=2)
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * d**-0.5
    length = k.shape[2]
    chunks = (length + CHUNK - 1) // CHUNK
    pad = chunks * CHUNK - length  # zeros after the end: a key of 0 writes nothing, and nothing reads back
    # [batch * heads, chunks, CHUNK, ...]
    q, k, v = (F.pad(x, (0, 0, 0, pad)).reshape(-1, chunks, CHUNK, x.shape[-1]) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)).reshape(-1, chunks, CHUNK) for x in (beta, g))

    cum = g.cumsum(-1)
    k_beta = k * beta[..., None]
    inverse = _unit_lower_inverse(k_beta.reshape(-1, CHUNK, d), k.reshape(-1, CHUNK, d), cum.reshape(-1, CHUNK))
    inverse = inverse.reshape(-1, chunks, CHUNK, CHUNK)
    u = inverse @ (v * beta[..., None])
    w = inverse @ (k_beta * cum.exp()[..., None])
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp((cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, -math.inf))
    within = (q @ k.transpose(-1, -2)) * decay

    # Each chunk's map of the state, then the state before each chunk.
    last = cum[..., -1:]
    k_out = (k * (last - cum).exp()[..., None]).transpose(-1, -2)
    m = last.exp()[..., None] * torch.eye(d, dtype=q.dtype, device=q.device) - k_out @ w
    r = k_out @ u
    chunk = torch.arange(chunks, device=q.device)
    for j in range(steps):
        # Chunks from 2^j on take the map 2^j before them; once 2^j >= chunks that is no chunk at all, so the
        # steps a short sequence does not need cost no arithmetic. (Chosen by a mask rather than sliced: ONNX
        # Runtime's symbolic shape inference simplifies every Slice's bounds with sympy, a second each.)
        at = chunk[chunk >= 2**j]
        r = _update(r, chunk, 2**j, m.index_select(1, at) @ r.index_select(1, at - 2**j) + r.index_select(1, at))
        if j + 1 < steps:
            m = _update(m, chunk, 2**j, m.index_select(1, at) @ m.index_select(1, at - 2**j))
    state = _update(torch.zeros_like(r), chunk, 1, r.index_select(1, chunk[chunk >= 1] - 1))

    out = within @ u + (q * cum.exp()[..., None] - within @ w) @ state
    out = out.reshape(-1, heads, chunks * CHUNK, dv)[:, :, :length]
    return out.transpose(1, 2).to(dtype).contiguous(), None


def reference_modules(model: torch.nn.Module) -> list[ModuleType]:
    """The transformers modules of `model`'s layers that define the chunked gated delta rule."""
    found = {sys.modules[type(m).__module__] for m in model.modules()}
    return sorted((m for m in found if callable(getattr(m, REFERENCE, None))), key=lambda m: m.__name__)


def split_as_slices(split: Any) -> Any:
    """torch.tensor_split that cuts at a list of indices with slices. transformers 5.25's gated-delta-rule layers
    cut the sequence at its length less the states a cache keeps (none here); the TorchScript exporter writes
    such a cut at a traced index as a Tile that ONNX Runtime refuses ('repeat' input must be 1 dimensional),
    where a slice of each part exports as plain Slice nodes. Sections (an int) go to `split` as they are."""

    def tensor_split(x: torch.Tensor, indices_or_sections: Any, dim: int = 0) -> tuple[torch.Tensor, ...]:
        if not isinstance(indices_or_sections, list | tuple):
            return split(x, indices_or_sections, dim)  # type: ignore[no-any-return]
        bounds = [0, *indices_or_sections, None]
        lead = (slice(None),) * (dim % x.dim())
        return tuple(x[(*lead, slice(a, b))] for a, b in itertools.pairwise(bounds))

    return tensor_split


@contextmanager
def loop_free(model: torch.nn.Module, max_length: int) -> Iterator[None]:
    """Within: `model`'s gated-delta-rule layers call gated_delta_rule, for sequences of up to `max_length`
    tokens, and torch.tensor_split cuts with slices (split_as_slices). The layers look the function up in their
    module's globals at each call."""
    modules = reference_modules(model)
    saved = [getattr(m, REFERENCE) for m in modules]
    split = torch.tensor_split
    try:
        for module in modules:
            setattr(module, REFERENCE, partial(gated_delta_rule, steps=scan_steps(max_length)))
        torch.tensor_split = split_as_slices(split)
        yield
    finally:
        torch.tensor_split = split
        for module, function in zip(modules, saved, strict=True):
            setattr(module, REFERENCE, function)
