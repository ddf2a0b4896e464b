"""Verification of a draft tree against the target's logits: the single home of the speculative acceptance maths.

Every verifier takes the tree and ``logits [N+1, V]`` of the one target forward over ``[root, *tree.tokens]``
(row 0 = the root's next-token logits, row i + 1 = node i's) and returns ``(path, bonus)``: ``path`` lists the
accepted node indices from the root down (possibly empty) and ``bonus`` is the token the target itself supplies
after the last accepted node, which becomes the next root.

- :func:`verify_greedy`: the longest path whose every token is the target's argmax (exact at temperature 0).
- :func:`verify_sampling`: multi-candidate speculative sampling (recursive rejection sampling, as SpecInfer and
  EAGLE); lossless: the emitted tokens follow exactly the target's shaped distribution
  (:func:`harness.engine.sampling.logits_to_probs`), for deterministic and for sampled proposals.
- :func:`verify_typical`: Medusa-1's typical acceptance. Not lossless.

Randomness only comes from the ``torch.Generator`` passed in, so a seeded run is reproducible.
"""

from __future__ import annotations

import torch

from harness.engine.sampling import SamplingParams, logits_to_probs, sample
from harness.engine.tree import DraftTree, children_lists, depths


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Walk from the root, each time into the child whose token is the target's argmax; stop when none is.

    Example: tree tokens [5, 6, 7], parents [-1, -1, 1], argmax per slot [6, 9, 7, 0] -> the root's argmax 6 is
    node 1, node 1's argmax 7 is node 2, node 2's argmax 0 has no child -> path [1, 2], bonus 0.
    """
    best = logits.argmax(-1).tolist()  # [N+1]
    tokens = tree.tokens.tolist()
    kids = children_lists(tree.parents)
    path: list[int] = []
    slot = 0
    while True:
        nxt = next((c for c in kids[slot] if tokens[c] == best[slot]), None)
        if nxt is None:
            return path, best[slot]
        path.append(nxt)
        slot = nxt + 1


def verify_greedy_on_device(tree: DraftTree, logits: torch.Tensor,
                            ancestors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`verify_greedy` computed where the logits live, without reading a value on the host.

    ``ancestors [N+1, N+1]`` is :func:`harness.engine.tree.ancestor_matrix` of the tree. A node is on the accepted
    path when it and each of its ancestors is the first child (in rank order) whose token is its parent slot's
    argmax: exactly the nodes the walk of :func:`verify_greedy` visits. Returns ``(on_path [N] bool,
    bonus [1] long, best [N+1])``: the accepted nodes, the argmax of the deepest accepted slot (slot 0 when none is
    accepted) and every slot's argmax. Example (``verify_greedy``'s): tokens [5, 6, 7], parents [-1, -1, 1],
    argmax per slot [6, 9, 7, 0] -> on_path [False, True, True], bonus [0].
    """
    best = logits.argmax(-1)  # [N+1]
    n = len(tree)
    device = best.device
    parents, tokens = tree.parents.to(device), tree.tokens.to(device)
    order = torch.arange(n, device=device)
    match = tokens == best[(parents + 1).clamp(min=0)]  # [N] the node is its parent slot's argmax
    earlier_sibling = (parents[:, None] == parents[None, :]) & (order[None, :] < order[:, None])  # [N, N]
    first = match & ~(earlier_sibling & match[None, :]).any(1)  # [N]
    on_path = ~(ancestors[1:, 1:].to(device) & ~first[None, :]).any(1)  # [N]
    root = torch.zeros(1, dtype=torch.long, device=device)
    last = torch.cat([root, torch.where(on_path, order + 1, 0)]).max()  # the deepest accepted slot (0 = root)
    return on_path, best[last].view(1), best


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    """One U[0, 1) draw from ``generator`` (on the generator's own device when it has one)."""
    dev = generator.device if generator is not None else device
    return float(torch.rand((), generator=generator, device=dev))


def _normalise(p: torch.Tensor) -> torch.Tensor:
    return p / p.sum()


def _draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from ``p [V]``, on the generator's device (a CPU generator may drive a CUDA target)."""
    if generator is not None and generator.device != p.device:
        p = p.to(generator.device)
    return int(sample(p, generator))


def rejection_step(p: torch.Tensor, candidates: list[int], q: torch.Tensor | None,
                   generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """Try the sibling ``candidates`` (tokens, in rank order) against the target distribution ``p [V]``.

    Returns ``(j, p)``: the position j of the accepted candidate (None if all are rejected) and the residual
    distribution the bonus token must be drawn from when nothing is accepted.

    Deterministic proposal (``q`` None): accept x with probability p(x); on rejection p(x) <- 0 and renormalise.
    Sampled proposal (``q [V]`` = the distribution the siblings were drawn from without replacement): candidate j
    was drawn from q_j = q with the earlier candidates zeroed and renormalised; accept with probability
    min(1, p(x)/q_j(x)), else p <- normalise(max(0, p - q_j)). Both rules are lossless.

    Worked example (deterministic): p = [.5, .3, .2], candidates [0, 1]. Token 0 is emitted with prob .5. If it is
    rejected, p becomes [0, .6, .4] and token 1 is accepted with prob .6: overall .5 * .6 = .3 = p(1). If both
    are rejected (prob .5 * .4 = .2) the residual is [0, 0, 1], so token 2 comes out with prob .2 = p(2).
    """
    p = p.clone()
    q_j = None if q is None else q.clone()
    for j, x in enumerate(candidates):
        if q_j is None:
            px = float(p[x])
            if px > 0 and _uniform(generator, p.device) < px:
                return j, p
            p[x] = 0.0
            total = float(p.sum())
            if total <= 0:  # x held all the mass (rejected only by rounding): exact arithmetic accepts it
                return j, p
            p = p / total
        else:
            qx = float(q_j[x])
            if qx > 0:
                if _uniform(generator, p.device) * qx < float(p[x]):
                    return j, p
                residual = (p - q_j).clamp(min=0)
                total = float(residual.sum())
                if total > 0:
                    p = residual / total
            q_j[x] = 0.0  # the next sibling was drawn without replacement: x is excluded
            total_q = float(q_j.sum())
            if total_q <= 0:
                return None, p
            q_j = q_j / total_q
    return None, p


def verify_sampling(tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
                    generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Lossless multi-candidate speculative sampling down the tree (see :func:`rejection_step`).

    At each reached slot, p = ``logits_to_probs(logits[slot])``; the slot's children are tried in rank order; the
    first accepted child becomes the next slot. When no child is accepted the bonus is drawn from the residual p;
    at a leaf it is drawn from the leaf's own p (with temperature and top-p applied; the published EAGLE code
    forgets the processor there). At temperature 0, p is one-hot and this equals :func:`verify_greedy`.
    """

    def step(slot: int, p: torch.Tensor, children: list[int]) -> tuple[int | None, torch.Tensor]:
        q = None if tree.draft_probs is None else tree.draft_probs[slot].to(p.device, torch.float32)
        return rejection_step(p, [tokens[c] for c in children], q, generator)

    tokens = tree.tokens.tolist()
    return walk_tree(tree, logits, sampling, generator, step)


def walk_tree(tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None,
              step) -> tuple[list[int], int]:
    """The descent shared by sampling verifiers: from the root, ``step(slot, p [V], children) -> (j | None,
    residual [V])`` picks the accepted child (position j in ``children``) or none; the bonus is drawn from the
    residual when nothing is accepted and from the leaf's p at a leaf. A verifier is a choice of ``step``."""
    kids = children_lists(tree.parents)
    path: list[int] = []
    slot = 0
    while True:
        p = logits_to_probs(logits[slot], sampling)  # [V]
        if not kids[slot]:
            return path, _draw(p, generator)
        j, residual = step(slot, p, kids[slot])
        if j is None:
            return path, _draw(residual, generator)
        path.append(kids[slot][j])
        slot = kids[slot][j] + 1


def typical_threshold(logits: torch.Tensor, temperature: float, posterior_threshold: float,
                      posterior_alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa's typical-acceptance test per row: ``(probs [..., V], threshold [...])``.

    probs = softmax(logits / T) (no top-p/top-k, as in Medusa); threshold = min(epsilon, delta * exp(-H(probs)))
    with epsilon = ``posterior_threshold`` and delta = ``posterior_alpha``. A token x passes when probs[x] > it.
    Example: a uniform row over 4 tokens has H = ln 4, so threshold = min(0.09, 0.3 / 4) = 0.075 < 0.25: all pass.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy))
    return probs, threshold


def verify_typical(tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
                   posterior_threshold: float = 0.09, posterior_alpha: float = 0.3,
                   generator: torch.Generator | None = None, fast: bool = True) -> tuple[list[int], int]:
    """Medusa-1 typical acceptance (NOT lossless): the deepest node whose whole path passes the typical test.

    Node i passes when p_T(token_i | its parent slot) > min(epsilon, delta * exp(-H)) (:func:`typical_threshold`).
    Among the deepest passing paths, the one with the largest sum of log p_T wins (Medusa's tie-break). The bonus
    is the argmax of the last accepted slot when ``fast`` (Medusa's ``medusa_generate`` default and Spec-Bench),
    else a sample from p_T restricted to the tokens that pass the test. At temperature 0 this is
    :func:`verify_greedy`.
    """
    if sampling.greedy:
        return verify_greedy(tree, logits)
    n = len(tree)
    par = tree.parents.tolist()
    probs, threshold = typical_threshold(logits, sampling.temperature, posterior_threshold, posterior_alpha)
    parent_slot = torch.tensor(par, dtype=torch.long, device=logits.device) + 1  # [N]
    node_p = probs[parent_slot, tree.tokens.to(logits.device)] if n else probs.new_zeros(0)  # [N]
    passes = (node_p > threshold[parent_slot]).tolist() if n else []
    logp = torch.log(node_p).tolist() if n else []
    ok: list[bool] = []
    score: list[float] = []
    for i, p in enumerate(par):
        ok.append(passes[i] and (p < 0 or ok[p]))
        score.append(logp[i] + (score[p] if p >= 0 else 0.0))
    d = depths(tree.parents).tolist() if n else []
    best, best_key = None, (0, 0.0)
    for i in range(n):
        if ok[i] and (d[i], score[i]) > best_key:
            best, best_key = i, (d[i], score[i])
    path: list[int] = []
    node = best
    while node is not None and node >= 0:
        path.append(node)
        node = par[node]
    path.reverse()
    last = path[-1] + 1 if path else 0
    if fast:
        return path, int(logits[last].argmax())
    row_p, row_t = probs[last], threshold[last]
    allowed = torch.where(row_p > row_t, row_p, torch.zeros_like(row_p))
    if float(allowed.sum()) <= 0:
        allowed = row_p
    return path, _draw(_normalise(allowed), generator)
