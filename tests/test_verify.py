"""Verification rules on literal logits.

The statistical tests use a first-order Markov "target" over V = 5 tokens (the logits of a slot depend only on its
own token), so the exact joint distribution of the first three emitted tokens is p0(t1) P(t2|t1) P(t3|t2). One
verification step emits t1 (and maybe t2, t3); whatever it does not emit is drawn from the chain directly, as the
next (empty-tree) steps would. A lossless rule must be indistinguishable from the chain; a wrong one is caught.
"""

from collections import Counter
from itertools import product

import pytest
import torch

from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.tree import DraftTree
from harness.engine.verify import (
    rejection_step,
    typical_threshold,
    verify_greedy,
    verify_sampling,
    verify_typical,
)
from tests.support.helpers import chi_square_pvalue

V = 5
ROOT = torch.tensor([0.5, 1.0, 0.2, 0.8, -0.5])
NEXT = torch.tensor([  # NEXT[x] = logits after token x
    [1.5, 0.0, 0.3, -1.0, 0.2],
    [0.1, 0.3, 1.2, -0.2, 0.0],
    [0.0, 0.5, 0.3, 0.2, 1.0],
    [0.9, 0.9, -0.5, 0.0, 0.1],
    [-0.3, 0.2, 0.0, 1.4, 0.6],
])
Q0 = torch.tensor([0.05, 0.15, 0.4, 0.4, 0.0])  # draft distribution at the root: puts no mass on token 4
QN = torch.softmax(NEXT.flip(1), dim=-1)  # a draft that disagrees with the target below the root
FIXED_TOKENS = torch.tensor([1, 3, 2, 0])  # deterministic tree: root -> {1, 3}, 1 -> 2, 3 -> 0
FIXED_PARENTS = torch.tensor([-1, -1, 0, 1])


def tree_logits(tokens: torch.Tensor) -> torch.Tensor:
    return torch.cat([ROOT[None], NEXT[tokens]])  # [N+1, V]


def sampled_tree(g: torch.Generator) -> DraftTree:
    """Root children: 2 draws without replacement from Q0; one child under each, drawn from QN[parent]."""
    first = torch.multinomial(Q0, 2, replacement=False, generator=g)
    second = torch.stack([torch.multinomial(QN[int(x)], 1, generator=g)[0] for x in first])
    tokens = torch.cat([first, second])
    probs = torch.cat([Q0[None], QN[first], torch.full((2, V), 1 / V)])  # leaves' rows are never used
    return DraftTree(tokens, FIXED_PARENTS.clone(), probs)


def chain_probs(sampling: SamplingParams) -> dict:
    p0 = logits_to_probs(ROOT, sampling)
    pn = logits_to_probs(NEXT, sampling)
    return {(a, b, c): float(p0[a] * pn[a, b] * pn[b, c]) for a, b, c in product(range(V), repeat=3)}


def three_tokens(tree: DraftTree, verifier, sampling, g) -> tuple:
    path, bonus = verifier(tree, tree_logits(tree.tokens), sampling, g)
    out = [int(tree.tokens[i]) for i in path] + [bonus]
    while len(out) < 3:
        out.append(int(torch.multinomial(logits_to_probs(NEXT[out[-1]], sampling), 1, generator=g)))
    return tuple(out[:3])


def run_many(verifier, sampling, proposal: str, n: int = 4000) -> float:
    g = torch.Generator().manual_seed(1234)
    counts = Counter()
    for _ in range(n):
        tree = sampled_tree(g) if proposal == "sampled" else DraftTree(FIXED_TOKENS, FIXED_PARENTS)
        counts[three_tokens(tree, verifier, sampling, g)] += 1
    return chi_square_pvalue(counts, chain_probs(sampling))


SAMPLINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.8)]


@pytest.mark.parametrize("proposal", ["deterministic", "sampled"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T1", "T0.7-top_p0.8"])
def test_verify_sampling_preserves_the_target_distribution(proposal, sampling):
    # a wrong acceptance ratio, residual, sibling renormalisation or leaf distribution (e.g. the published code's
    # raw softmax at a leaf when T != 1) shifts the joint of the first three tokens; 4000 draws detect that
    assert run_many(verify_sampling, sampling, proposal) > 1e-3


@pytest.mark.parametrize("proposal", ["deterministic", "sampled"])
def test_typical_acceptance_is_detected_as_lossy(proposal):
    # the same statistic must reject Medusa's typical acceptance, otherwise the test above proves nothing
    def typical(tree, logits, sampling, g):
        return verify_typical(tree, logits, sampling, generator=g)

    assert run_many(typical, SamplingParams(temperature=1.0), proposal) < 1e-6


def test_wrong_draft_probs_are_detected_as_lossy():
    # the ratio rule min(1, p/q) is only lossless with the q the children were really drawn from; verifying with
    # a uniform q instead must be caught. (Ignoring q altogether, i.e. the q = 1 rule, is lossless but accepts
    # less: it does not belong here.)
    def wrong_q(tree, logits, sampling, g):
        uniform = torch.full_like(tree.draft_probs, 1 / V)
        return verify_sampling(DraftTree(tree.tokens, tree.parents, uniform), logits, sampling, g)

    assert run_many(wrong_q, SamplingParams(temperature=1.0), "sampled") < 1e-6


def test_rejection_step_worked_example():
    # docstring example: p = [.5, .3, .2], candidates [0, 1] (deterministic): accept 0 w.p. .5, 1 w.p. .3, and
    # otherwise the residual is all on token 2
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2])
    outcomes = Counter()
    for _ in range(4000):
        j, residual = rejection_step(p, [0, 1], None, g)
        outcomes[j] += 1
        if j is None:
            assert residual.tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert chi_square_pvalue(outcomes, {0: 0.5, 1: 0.3, None: 0.2}) > 1e-3


def test_rejection_step_sampled_residual():
    # q = [.6, .4, 0], p = [.3, .3, .4], candidate 0 (q(0) = .6): accept w.p. .3/.6 = .5; on rejection the
    # residual is normalise(max(0, p - q)) = normalise([0, 0, .4]) = [0, 0, 1] -- never token 0 again
    g = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.3, 0.3, 0.4]), torch.tensor([0.6, 0.4, 0.0])
    outcomes = Counter()
    for _ in range(2000):
        j, residual = rejection_step(p, [0], q, g)
        outcomes[j] += 1
        if j is None:
            assert residual.tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert chi_square_pvalue(outcomes, {0: 0.5, None: 0.5}) > 1e-3


def test_verify_greedy_follows_the_argmax_child():
    # docstring example: root argmax 6 = node 1 (the second sibling: greedy must not stop at rank 0), node 1's
    # argmax 7 = node 2, node 2's argmax 0 has no child -> bonus 0
    tree = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 1]))
    logits = torch.nn.functional.one_hot(torch.tensor([6, 9, 7, 0]), 10).float()
    assert verify_greedy(tree, logits) == ([1, 2], 0)
    # nothing matches: the bonus is the root's argmax
    assert verify_greedy(tree, torch.nn.functional.one_hot(torch.tensor([3, 9, 7, 0]), 10).float()) == ([], 3)
    # an empty tree is a plain greedy step
    empty = DraftTree(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))
    assert verify_greedy(empty, torch.tensor([[0.0, 2.0, 1.0]])) == ([], 1)


def test_verify_sampling_at_temperature_zero_is_greedy():
    # T = 0 gives one-hot p, so the sampling walk must reproduce verify_greedy exactly
    tree = DraftTree(FIXED_TOKENS, FIXED_PARENTS)
    logits = tree_logits(FIXED_TOKENS)
    assert verify_sampling(tree, logits, SamplingParams(), None) == verify_greedy(tree, logits)


def test_typical_threshold_uniform_row():
    # uniform over 4: H = ln 4, delta * exp(-H) = 0.3 / 4 = 0.075 < epsilon 0.09
    probs, thr = typical_threshold(torch.zeros(4), 1.0, 0.09, 0.3)
    assert probs.tolist() == pytest.approx([0.25] * 4)
    assert float(thr) == pytest.approx(0.075, rel=1e-3)


def test_verify_typical_picks_deepest_then_most_likely():
    sampling = SamplingParams(temperature=1.0)
    root = torch.log(torch.tensor([0.6, 0.3, 0.02, 0.08]))  # threshold = min(.09, .3 exp(-H)) ~ .09
    # children [1, 0] are leaves and both pass; the deeper-or-equal tie goes to the larger log p (token 0), even
    # though it has rank 1; token 2 (p = .02) never passes
    tree = DraftTree(torch.tensor([1, 0, 2]), torch.tensor([-1, -1, -1]))
    logits = torch.stack([root, root, root, root])
    assert verify_typical(tree, logits, sampling)[0] == [1]
    # a deeper passing path beats a more likely shallow one: node 2 (token 1 under token 1) is at depth 2
    tree = DraftTree(torch.tensor([1, 0, 0]), torch.tensor([-1, -1, 0]))
    path, bonus = verify_typical(tree, logits, sampling)
    assert path == [0, 2]
    assert bonus == 0  # fast mode: argmax of the last accepted slot
    # a failing parent blocks its passing child
    tree = DraftTree(torch.tensor([2, 0]), torch.tensor([-1, 0]))
    assert verify_typical(tree, logits, sampling)[0] == []


def test_a_vanishing_top_p_keeps_the_top_token_and_a_vanishing_temperature_is_refused():
    """top_p = 1e-300 is 0 in float32: the nucleus dropped every token and sampling read NaN; it must keep the most
    likely token. A temperature of 1e-40 overflows logits / T to inf: it is refused where the settings are made."""
    from harness.engine.sampling import SamplingParams, logits_to_probs

    probs = logits_to_probs(torch.tensor([[2.0, 1.0, 0.0]]), SamplingParams(temperature=1.0, top_p=1e-300))
    assert probs.tolist() == [[1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a finite number >= 1e-05, got 1e-40"):
        SamplingParams(temperature=1e-40)
    assert SamplingParams(temperature=1e-5).temperature == 1e-5
