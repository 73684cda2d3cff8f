"""When does a head go blind? Each head's blindness distance and underflow shares, from its position stack.

A softmax weight is exactly zero once its logit falls more than ``tau`` (``blindheads.numerics``) below what the
kernel subtracts before it rounds. Two kernels, two definitions (``softmax``):

- ``fused`` (the paper's; FlexAttention and flash kernels): the kernel tests ``exp(x - max)`` before normalising,
  so a head is blind where its bias-only logit reaches ``-tau``.
- ``materialized`` (eager and SDPA, which hand out normalised weights): ``exp(x - max - ln Z)`` underflows, so a
  head goes blind where the bias reaches ``-(tau - ln Z_h)``, ``ln Z_h / m`` tokens sooner. ``Z_h`` is the head's
  bias-only normaliser over a row of ``context`` keys (the last query's row, whose ``Z`` is the largest). These
  kernels take their logits in ``dtype`` (SDPA its mask in the model dtype), so the edge moves to where the bias
  rounds below ``-(tau - ln Z_h)``: up to half a bfloat16 spacing (0.25 at tau), ``0.25 / m`` tokens.

Fused kernels compute logits in float32, so there the bias is not rounded to ``dtype``; only the weights are.

How the distance is found depends on what the stack declares (``blindheads.modules.position.base``):

- every stage invertible: the closed form, stage by stage;
- a bias that never rises with distance (``monotone``) without an inverse: bisection;
- a bias that may rise again (a learned T5 table, FIRE's MLP): a scan of every distance up to the context. Its
  ``blind_distance`` is the *first* distance at which a bias-only weight is zero: every nearer key is sighted, but
  farther ones may be sighted again, so its underflow shares count the zero weights themselves
  (``BlindnessReport.monotone`` says which reading applies).

A bias that depends on the query's position (FIRE) is evaluated for the context's last query (position
``context - 1``), the row whose normaliser the ``materialized`` definition takes; its all-pairs share counts every
row as that one.

Long before that, a head stops *learning* to read a key: its **horizon distance** is where the bias alone puts a key
``horizon`` nats below the row's largest weight (``H / m`` for ALiBi; the same inverse or search as the blind
distance, with ``H`` for ``tau``). ``H`` defaults to ``numerics.LEARNING_HORIZON``, the edge the committed
conjecture measured; it does not depend on the dtype.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from blindheads.modules.position.base import INVERSES, PositionStack, overrides
from blindheads.numerics import LEARNING_HORIZON, check_horizon, check_threshold, resolve_dtype, rounding_boundary, tau

SOFTMAXES = ("fused", "materialized")
NORMALISER_CHUNK = 2**16  # distances per chunk of the normaliser's log-sum-exp and of the scan: memory stays bounded
MAX_CHUNKS = 512  # beyond 2^25 keys a bias is neither summed nor scanned key by key


def on_cpu(stack: PositionStack) -> PositionStack:
    """The stack itself when it lives on the CPU, else a CPU copy: the calculator works in float64 on the CPU, also
    for a model being trained on a GPU."""
    tensors = [*stack.parameters(), *stack.buffers()]
    return stack if all(t.device.type == "cpu" for t in tensors) else copy.deepcopy(stack).cpu()


def check_softmax(softmax: str) -> str:
    if softmax not in SOFTMAXES:
        raise ValueError(f"unknown softmax {softmax!r}; valid: {', '.join(SOFTMAXES)}")
    return softmax


def bias_only_logits(
    stack: PositionStack, distances: Tensor, heads: Tensor | None = None, query: int | None = None
) -> Tensor:
    """The logit at q.k = 0 of keys at ``distances``, float64 on the CPU: per head and distance (heads, n) for
    distances (n,), or of head ``heads[i]`` at ``distances[i]`` when ``heads`` is given. Windows are not applied.
    ``query``: the query's position, which only a ``query_dependent`` stack needs."""
    if query is None and stack.query_dependent:
        raise ValueError("this position bias depends on the query's position: give the context length")
    d = distances.to(torch.float64)
    h = torch.arange(stack.num_heads)[:, None] if heads is None else heads
    d = d.expand(stack.num_heads, -1) if heads is None else d
    q = None if query is None else torch.tensor(float(query), dtype=torch.float64)
    return stack.logit(torch.zeros((), dtype=torch.float64), stack.bias_of_distance(d, h, q))


def _chunks(stack: PositionStack, context: int, refusal: str):
    """Distances ``0 .. context - 1``, ``NORMALISER_CHUNK`` at a time. Past ``MAX_CHUNKS`` chunks it raises
    ``refusal``: at once for a stack that is not ``monotone`` (every chunk would be needed), else when it gets
    there (a monotone sum usually stops long before)."""
    limit = MAX_CHUNKS * NORMALISER_CHUNK
    if not stack.monotone and context > limit:
        raise ValueError(f"a bias that may rise with distance is read key by key, up to {limit} keys: {refusal}")
    for start in range(0, context, NORMALISER_CHUNK):
        if start >= limit:
            raise ValueError(refusal)
        yield torch.arange(start, min(start + NORMALISER_CHUNK, context), dtype=torch.float64)


@torch.no_grad()
def log_normaliser(stack: PositionStack, context: int) -> Tensor:
    """Per head, ``ln Z``: the log-sum-exp of the bias-only logits of the last query's keys, at distances
    ``0 .. context - 1``.

    Summed in chunks of distances (bounded memory). A ``monotone`` bias-only logit falls with distance, so every
    later key weighs at most what the chunk's last key does: once ``context`` such keys could not change the sum in
    float64, it stops. Any other bias is summed to the end. A sum that needs more than ``MAX_CHUNKS`` chunks (log
    distances at long contexts) is refused rather than left running.
    """
    stack, total = on_cpu(stack), torch.full((stack.num_heads,), -math.inf, dtype=torch.float64)
    refusal = (
        f"the materialized normaliser does not converge within {MAX_CHUNKS * NORMALISER_CHUNK} keys for this bias; "
        f"use --softmax fused or a context below {context}"
    )
    for d in _chunks(stack, context, refusal):
        logits = bias_only_logits(stack, d, query=context - 1).masked_fill(d >= stack.window(), -math.inf)
        total = torch.logaddexp(total, torch.logsumexp(logits, dim=-1))
        settled = math.log(context) + logits[:, -1] - total < math.log(torch.finfo(torch.float64).eps)
        if stack.monotone and settled.all():
            break
    return total


def effective_tau(
    stack: PositionStack, context: int, dtype: str | torch.dtype, threshold: str, softmax: str = "fused"
) -> Tensor:
    """Per head, how far below the row's maximum a bias-only logit may fall before its weight is zero."""
    threshold_tau = torch.full((stack.num_heads,), tau(dtype, threshold), dtype=torch.float64)
    if check_softmax(softmax) == "fused":
        return threshold_tau
    return -rounding_boundary(log_normaliser(stack, context) - threshold_tau, dtype)


def _target(stack: PositionStack, tau: float | Tensor) -> Tensor:
    return -torch.as_tensor(tau, dtype=torch.float64).expand(stack.num_heads)


@torch.no_grad()
def blind_distances(
    stack: PositionStack, tau: float | Tensor, search: bool = False, context: int | None = None
) -> Tensor:
    """Per head, the distance beyond which the bias-only logit is below ``-tau``; ``inf`` for a head never blind.

    A ``monotone`` stack: the closed form unless a component has no inverse or ``search=True``, then a bisection.
    Any other stack: the first integer distance below ``-tau`` of a scan over the last query's ``context`` keys
    (see the module docstring; ``context`` is required, and by a ``query_dependent`` stack too). A sliding window
    caps the result. ``tau`` may be one value or one per head (``effective_tau``).
    """
    stack, target = on_cpu(stack), _target(stack, tau)
    if not stack.monotone:
        if context is None:
            raise ValueError("a position bias that may rise with distance is scanned: give the context length")
        return first_blind_key(blind_keys(stack, tau, context))
    distances = None if search or stack.query_dependent else _closed_form(stack, target)
    if distances is None:
        distances = _search(stack, target, None if context is None else context - 1)
    return distances.clamp_max(stack.window()).clamp_min(0)


@torch.no_grad()
def blind_keys(stack: PositionStack, tau: float | Tensor, context: int) -> Tensor:
    """Per head and distance ``0 .. context - 1`` of the last query's row, whether the key's weight is zero: its
    bias-only logit is below ``-tau``, or a window masks it. (heads, context) booleans."""
    stack, target = on_cpu(stack), _target(stack, tau)
    refusal = f"scan a context of at most {MAX_CHUNKS * NORMALISER_CHUNK} keys, not {context}"
    return torch.cat(
        [
            (bias_only_logits(stack, d, query=context - 1) < target[:, None]) | (d >= stack.window())
            for d in _chunks(stack, context, refusal)
        ],
        dim=-1,
    )


def first_blind_key(blind: Tensor) -> Tensor:
    """Per head, the first distance whose key is blind in a (heads, distances) mask; ``inf`` where none is."""
    first = blind.to(torch.uint8).argmax(-1).to(torch.float64)
    return torch.where(blind.any(-1), first, math.inf)


def predicted_blind_distances(
    stack: PositionStack, context: int, dtype: str | torch.dtype, threshold: str, softmax: str = "fused"
) -> Tensor:
    """Per head, where the bias alone makes weights exactly zero, for one context, dtype, threshold and softmax."""
    return blind_distances(stack, effective_tau(stack, context, dtype, threshold, softmax), context=context)


def horizon_distances(stack: PositionStack, context: int, horizon: float = LEARNING_HORIZON) -> Tensor:
    """Per head, the distance beyond which the bias alone puts a key more than ``horizon`` nats below the row's
    largest weight (the bias at distance 0): where the head stops learning to read it. ``inf``: never."""
    return blind_distances(stack, check_horizon(horizon), context=context)


def _closed_form(stack: PositionStack, target: Tensor) -> Tensor | None:
    """Invert the stack stage by stage: logits, then the bias limit, then the bias, then the distance transform.
    ``None`` when a component changes a stage it cannot invert, or several components add biases."""
    for c in stack:
        if any(overrides(c, stage) and not overrides(c, inverse) for stage, inverse in INVERSES.items()):
            return None
    biased = [c for c in stack if overrides(c, "bias")]
    if len(biased) > 1:
        return None
    if not biased:
        return torch.full((stack.num_heads,), math.inf, dtype=torch.float64)
    bias = target.clone()
    for c in reversed(list(stack)):
        bias = c.inverse_logits(bias)  # q.k = 0, and every score transform keeps 0 at 0
    for c in reversed(list(stack)):
        bias = c.inverse_limit_bias(bias)
    unreachable = ~torch.isfinite(bias)
    d = biased[0].inverse_bias(torch.where(unreachable, torch.zeros_like(bias), bias), torch.arange(stack.num_heads))
    for c in reversed(list(stack)):
        d = c.inverse_distance(d)
    return torch.where(unreachable, torch.full_like(d, math.inf), d)


@torch.no_grad()
def _search(stack: PositionStack, target: Tensor, query: int | None, steps: int = 200) -> Tensor:
    """Bisection of a monotone bias on ``u = ln(1 + d)``, so one search covers every distance a float64 can hold;
    ``query``: the query's position, for a ``query_dependent`` stack."""
    low = torch.zeros(stack.num_heads, dtype=torch.float64)
    high = torch.full_like(low, math.log(torch.finfo(torch.float64).max))
    heads = torch.arange(stack.num_heads)

    def below(u: Tensor) -> Tensor:
        return bias_only_logits(stack, u.expm1(), heads, query) < target

    reachable = below(high)
    for _ in range(steps):
        middle = (low + high) / 2
        is_below = below(middle)
        high, low = torch.where(is_below, middle, high), torch.where(is_below, low, middle)
    return torch.where(reachable, high.expm1(), torch.full_like(high, math.inf))


def first_blind_token(distance: Tensor) -> Tensor:
    """The first integer distance at or beyond a (continuous) blindness distance."""
    return torch.ceil(distance)


def underflow_last_query(distance: Tensor, context: int) -> Tensor:
    """Share of the last query's ``context`` keys (distances 0..L-1) that are blind, per head."""
    blind = (context - first_blind_token(distance)).clamp(min=0, max=context)
    return blind / context


def underflow_all_pairs(distance: Tensor, context: int) -> Tensor:
    """Share of all ``L(L+1)/2`` causal query-key pairs of an ``L``-token sequence that are blind, per head.

    With ``materialized`` distances every row is counted with the last row's normaliser, the largest: shorter rows
    never reach the blindness distance unless their own normaliser has already converged to it.
    """
    count = (context - first_blind_token(distance)).clamp(min=0, max=context)
    return count * (count + 1) / (float(context) * (context + 1))  # a float: L(L+1) can pass int64


@dataclass
class HeadBlindness:
    slope: float | None  # the head's ALiBi slope, where its stack has one
    blind_distance: float
    horizon_distance: float  # where its bias passes the learning horizon: keys beyond it are not learned
    underflow_last_query: float
    underflow_all_pairs: float


@dataclass
class BlindnessReport:
    """Per-head blindness of a position stack at one context length, dtype, threshold mode and softmax.

    ``monotone``: whether the stack's bias never rises with distance, so every key beyond ``blind_distance`` is
    blind; if not, ``blind_distance`` is the first blind key and the shares count the zero weights themselves.
    """

    tau: float
    horizon: float  # the learning horizon, in nats below a row's largest weight
    dtype: str
    threshold: str
    softmax: str
    context: int
    heads: list[HeadBlindness]
    underflow_last_query: float
    underflow_all_pairs: float
    monotone: bool

    def to_dict(self) -> dict:
        return asdict(self)


def blindness_report(
    stack: PositionStack,
    context: int,
    dtype: str = "bfloat16",
    threshold: str = "normal",
    softmax: str = "fused",
    horizon: float = LEARNING_HORIZON,
) -> BlindnessReport:
    """Tau, per-head blindness and horizon distances and underflow shares, and their averages over heads."""
    check_threshold(threshold)
    horizons = horizon_distances(stack, context, horizon)
    if stack.monotone:
        distances = predicted_blind_distances(stack, context, dtype, threshold, softmax)
        last, pairs = underflow_last_query(distances, context), underflow_all_pairs(distances, context)
    else:
        blind = blind_keys(stack, effective_tau(stack, context, dtype, threshold, softmax), context)
        distances, last = first_blind_key(blind), blind.double().mean(-1)
        pairs_at_distance = context - torch.arange(context, dtype=torch.float64)
        pairs = (blind * pairs_at_distance).sum(-1) / (float(context) * (context + 1) / 2)
    slopes = next((c.head_parameters()["slope"].tolist() for c in stack if "slope" in c.head_parameters()), None)
    slopes = slopes or [None] * stack.num_heads
    heads = [
        HeadBlindness(slope, float(dist), float(deaf), float(lq), float(ap))
        for slope, dist, deaf, lq, ap in zip(slopes, distances, horizons, last, pairs)
    ]
    return BlindnessReport(
        tau=tau(dtype, threshold),
        horizon=float(horizon),
        dtype=str(resolve_dtype(dtype)).removeprefix("torch."),
        threshold=threshold,
        softmax=softmax,
        context=context,
        heads=heads,
        underflow_last_query=float(last.mean()),
        underflow_all_pairs=float(pairs.mean()),
        monotone=stack.monotone,
    )
