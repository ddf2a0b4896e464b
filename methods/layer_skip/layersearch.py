"""SWIFT's context-based layer set optimization (Xia et al., arXiv:2410.06916, Sec. 4.1, "Context-based layer set
optimization"): the maths of scoring a skipped-layer set and of proposing the next one, as small pure functions.

A candidate skips ``n`` of the ``d`` searchable layers (SWIFT keeps the first and the last layer); as a point of the
search space it is the one-hot vector ``[d]`` of its skipped layers (:func:`skip_point`). Its *matchness* is the
share of positions of a context where the skipping model's greedy next token equals the token the target itself
produced there (:func:`matchness`). Candidates come from random search (:func:`random_skip`) and, every few
iterations, from Bayesian optimization: a Gaussian process over the points scored so far, whose upper confidence
bound ``mean + kappa * std`` (SWIFT: UCB, kappa 2.5, noise 1e-2) is maximised over random points of ``[0, 1]^d``
(:func:`gp_ucb`); the best point's ``n`` largest coordinates are the set (:func:`top_layers`). SWIFT's optimiser fits
the kernel's length scale and refines the best random point by gradient steps; here the Matérn-5/2 kernel has a
fixed length scale and the best of the random points is taken.

Sub-layers: SWIFT's search space is the attention and the MLP sub-layer of each searchable layer, ``d = 2 (L - 2)``
coordinates (:func:`sub_layer_ids` / :func:`sub_layer_sets` map a set to them and back, in SWIFT's order); the
functions above take those ids as their ``layers``.
"""

from __future__ import annotations

import math

import torch

UCB_KAPPA = 2.5    # SWIFT's utility (arXiv:2410.06916, its released search settings)
GP_NOISE = 1e-2    # the Gaussian process's noise term (SWIFT's ``alpha``)
BAYES_QUERIES = 1024  # random points of [0, 1]^d the acquisition is maximised over


def matchness(draft_ids: torch.Tensor, target_ids: torch.Tensor) -> float:
    """The share of positions where ``draft_ids [n]`` (the skipping model's greedy next tokens) equal ``target_ids
    [n]`` (the target's own next tokens); one host read. Example: ([1, 2, 3, 4], [1, 0, 3, 0]) -> 0.5."""
    return float((draft_ids == target_ids).float().mean())


def skip_point(skip: list[int], layers: list[int]) -> torch.Tensor:
    """The point ``[d]`` of a set: 1.0 at the searchable ``layers [d]`` it skips, else 0.0.
    Example: ([1, 3], [1, 2, 3, 4]) -> [1., 0., 1., 0.]."""
    chosen = set(skip)
    return torch.tensor([1.0 if layer in chosen else 0.0 for layer in layers])


def top_layers(point: torch.Tensor, layers: list[int], n: int) -> list[int]:
    """The ``n`` searchable ``layers [d]`` with the largest coordinates of ``point [d]``, sorted (ties: the first).
    Example: ([0.1, 0.9, 0.3, 0.8], [1, 2, 3, 4], 2) -> [2, 4]."""
    order = sorted(range(len(layers)), key=lambda i: -float(point[i]))
    return sorted(layers[i] for i in order[:n])


def random_skip(layers: list[int], n: int, generator: torch.Generator) -> list[int]:
    """``n`` of the searchable ``layers`` drawn uniformly without replacement, sorted (SWIFT's random search)."""
    return sorted(layers[i] for i in torch.randperm(len(layers), generator=generator)[:n].tolist())


def matern52(a: torch.Tensor, b: torch.Tensor, length_scale: float) -> torch.Tensor:
    """The Matérn-5/2 kernel between the points ``a [m, d]`` and ``b [q, d]``: ``[m, q]``, 1 at distance 0.
    With r = |a - b| / length_scale: (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)."""
    r = torch.cdist(a, b) / length_scale  # [m, q]
    return (1 + math.sqrt(5) * r + 5 * r**2 / 3) * torch.exp(-math.sqrt(5) * r)


def gp_ucb(points: torch.Tensor, scores: torch.Tensor, queries: torch.Tensor, kappa: float = UCB_KAPPA,
           noise: float = GP_NOISE) -> torch.Tensor:
    """The upper confidence bound ``mean + kappa * std`` at ``queries [q, d]`` of a Gaussian process fitted to
    ``scores [m]`` at ``points [m, d]`` (scores standardised, Matérn-5/2 with length scale sqrt(d) / 2, noise
    ``noise``), in score units: ``[q]``. Far from every point it tends to the scores' mean + kappa * their std.
    Example: points [[0.], [1.]], scores [0., 1.], queries [[0.], [1.], [10.]] -> about [0.130, 1.119, 1.750]
    (near each point its score plus a little uncertainty; far off 0.5 + 2.5 * 0.5)."""
    points, scores, queries = points.double(), scores.double(), queries.double()
    mean, std = scores.mean(), scores.std(unbiased=False).clamp_min(1e-9)
    y = (scores - mean) / std  # [m]
    length = math.sqrt(points.shape[1]) / 2
    k = matern52(points, points, length) + noise * torch.eye(len(points), dtype=points.dtype)  # [m, m]
    ks = matern52(points, queries, length)  # [m, q]
    chol = torch.linalg.cholesky(k)
    alpha = torch.cholesky_solve(y[:, None], chol)[:, 0]  # [m]
    v = torch.cholesky_solve(ks, chol)  # [m, q]
    mu = ks.T @ alpha  # [q]
    var = (1 - (ks * v).sum(0)).clamp_min(0.0)  # [q] the prior variance is 1
    return (mean + std * (mu + kappa * var.sqrt())).float()


def bayes_skip(points: torch.Tensor, scores: torch.Tensor, layers: list[int], n: int,
               generator: torch.Generator, queries: int = BAYES_QUERIES) -> list[int]:
    """SWIFT's Bayesian step: of ``queries`` random points of ``[0, 1]^d``, the one with the highest :func:`gp_ucb`
    given ``scores [m]`` at ``points [m, d]``, read as the set of its ``n`` largest coordinates."""
    candidates = torch.rand(queries, len(layers), generator=generator)  # [queries, d]
    best = int(gp_ucb(points, scores, candidates).argmax())
    return top_layers(candidates[best], layers, n)


def split_sub_layers(attn: set[int] | list[int], mlp: set[int] | list[int]) -> tuple[list[int], list[int], list[int]]:
    """The layers whose attention (``attn``) and MLP (``mlp``) sub-layers are skipped, as the layers skipped whole
    (both), those with only the attention and those with only the MLP skipped; sorted.
    Example: attention of {1, 2}, MLP of {2, 3} -> ([2], [1], [3])."""
    attn, mlp = set(attn), set(mlp)
    return sorted(attn & mlp), sorted(attn - mlp), sorted(mlp - attn)


def sub_layer_ids(skip: list[int], attn_only: list[int], mlp_only: list[int], num_layers: int) -> list[int]:
    """A set as SWIFT's sub-layer coordinates (hemingkx/SWIFT@88caed7 ``get_next_point_to_probe``): of the ``2 (L -
    2)`` sub-layers of layers 1 .. L - 2, layer l's attention is ``l - 1`` and its MLP ``L - 2 + l - 1``; a layer in
    ``skip`` is both. Sorted. Example (L = 5): skip [2], attention of 1, MLP of 3 -> attention {1, 2} at 0, 1 and MLP
    {2, 3} at 4, 5: [0, 1, 4, 5]."""
    middle = num_layers - 2
    attn, mlp = set(skip) | set(attn_only), set(skip) | set(mlp_only)
    outside = sorted(i for i in attn | mlp if not 1 <= i <= middle)
    if outside:
        raise ValueError(f"layer {outside[0]} is not searchable: sub-layers of layers 1..{middle} only")
    return sorted([i - 1 for i in attn] + [middle + i - 1 for i in mlp])


def sub_layer_sets(ids: list[int], num_layers: int) -> tuple[list[int], list[int], list[int]]:
    """The inverse of :func:`sub_layer_ids`: the layers skipped whole (both sub-layers), those with only the
    attention and those with only the MLP skipped. Example (L = 5): [0, 1, 4, 5] -> ([2], [1], [3])."""
    middle = num_layers - 2
    return split_sub_layers({i + 1 for i in ids if i < middle}, {i - middle + 1 for i in ids if i >= middle})
