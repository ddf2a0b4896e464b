"""The speculative engine on tiny in-process Llamas (fp32, CPU).

Greedy: every method's output must equal vanilla's token for token, whatever it proposes (the target's own
continuation, wrong branches, random trees, nothing), with EOS and budget cuts. Sampling: the joint distribution of
the first three tokens must be the target's (chi-square against the exact distribution), for deterministic and for
sampled proposals, and a deliberately lossy verifier must be caught by the same test.
"""

import pytest
import torch

from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod, resolve_hidden_layers, tree_mask_4d
from harness.engine.tree import DraftTree, chain_tree
from harness.engine.verify import verify_typical
from methods.pld.pld import PromptLookup
from methods.vanilla import Vanilla
from tests.support.helpers import (
    GREEDY,
    SAMPLING_IDS,
    SAMPLINGS,
    check_generation,
    sampled_pvalue,
    sampling_target,
    tiny_target,
)


def engine_target():
    """A random 2-layer Llama over 64 bare token ids, no EOS."""
    return tiny_target(vocab=64, tokenizer=False)


class ContextMethod(SpeculativeMethod):
    """Test helper: tracks the committed context like a real method (prompt + accepted + pending root)."""

    def begin(self, prompt_ids, hidden):
        self.context = prompt_ids[0].tolist()

    def accept(self, tokens, hidden, next_root):
        self.context.extend(tokens)

    def next_logits(self, seq: list[int]) -> torch.Tensor:
        """The target's logits after ``seq`` (no cache; memoised, the models are tiny)."""
        memo = self.__dict__.setdefault("_memo", {})
        key = tuple(seq)
        if key not in memo:
            with torch.inference_mode():
                memo[key] = self.target.model(torch.tensor([seq])).logits[0, -1]
        return memo[key]


class OracleChain(ContextMethod):
    """Proposes the target's own greedy continuation: everything must be accepted."""

    depth = 4

    def greedy_continuation(self, root: int, n: int) -> list[int]:
        seq = self.context + [root]
        for _ in range(n):
            seq.append(int(self.next_logits(seq).argmax()))
        return seq[-n:]

    def propose(self, root, sampling, generator):
        return chain_tree(self.greedy_continuation(root, self.depth))


class OracleBranched(OracleChain):
    """The greedy continuation with a wrong sibling at every level (ranked first on even levels) and a wrong
    sub-branch below each wrong sibling: verification must find the right child whatever its rank."""

    def propose(self, root, sampling, generator):
        good = self.greedy_continuation(root, self.depth)
        vocab = self.target.config.vocab_size
        tokens, parents, prev = [], [], -1
        for level, tok in enumerate(good):
            wrong = (tok + 1) % vocab
            pair = [wrong, tok] if level % 2 == 0 else [tok, wrong]
            first = len(tokens)
            tokens += pair
            parents += [prev, prev]
            wrong_idx = first + pair.index(wrong)
            tokens.append((tok + 2) % vocab)
            parents.append(wrong_idx)
            prev = first + pair.index(tok)
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))


class RandomTree(ContextMethod):
    """Random tokens under random parents (own generator, independent of the sampling one): almost all rejected."""

    size = 6

    def propose(self, root, sampling, generator):
        g = self.__dict__.setdefault("_g", torch.Generator().manual_seed(99))
        tokens = torch.randint(0, self.target.config.vocab_size, (self.size,), generator=g)
        parents = torch.tensor([int(torch.randint(-1, i, (), generator=g)) if i else -1 for i in range(self.size)])
        return DraftTree(tokens, parents)


class EmptyTree(ContextMethod):
    def propose(self, root, sampling, generator):
        return chain_tree([])


PROMPT = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]])
METHODS = [PromptLookup, OracleChain, OracleBranched, RandomTree, EmptyTree]


@pytest.mark.parametrize("cls", METHODS, ids=lambda c: c.__name__)
def test_greedy_equals_vanilla(cls):
    # any verification, position, mask or cache-compaction error makes the continuation diverge from vanilla
    target = engine_target()
    want = Vanilla(target).generate(PROMPT, 40, GREEDY)
    method = cls(target)
    got = method.generate(PROMPT, 40, GREEDY)
    assert got.token_ids == want.token_ids
    assert got.stop_reason == "max_new_tokens"
    check_generation(got, method, PROMPT.shape[1], 40)


@pytest.mark.parametrize("cls", [OracleChain, OracleBranched])
def test_oracle_trees_are_fully_accepted(cls):
    # the target's own continuation: every step accepts the whole depth, so tau = depth + 1 (except the cut last
    # step); a verifier that stops early or a mask that lets siblings see each other would lower it
    target = engine_target()
    gen = cls(target).generate(PROMPT, 41, GREEDY)
    assert gen.accepted_drafts == [4] * len(gen.accepted_drafts)
    assert gen.accept_lengths == [1] + [5] * 8
    assert gen.counters["tree_tokens"] == 8 * (4 if cls is OracleChain else 12)


def test_random_trees_are_almost_never_accepted():
    # with 64 tokens, a random tree is right by chance only rarely; mostly one token per target forward
    gen = RandomTree(engine_target()).generate(PROMPT, 40, GREEDY)
    assert sum(gen.accepted_drafts) <= 4
    assert len(gen.accept_lengths) >= 36


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 7, 12])
@pytest.mark.parametrize("cls", [OracleChain, OracleBranched, PromptLookup])
def test_budget_cuts_are_exact(cls, budget):
    # accepted drafts past max_new_tokens must be cut (never emitted) and the cache cropped to match
    target = engine_target()
    want = Vanilla(target).generate(PROMPT, budget, GREEDY)
    method = cls(target)
    got = method.generate(PROMPT, budget, GREEDY)
    assert got.token_ids == want.token_ids and len(got.token_ids) == budget
    assert got.stop_reason == "max_new_tokens"
    check_generation(got, method, PROMPT.shape[1], budget)


@pytest.mark.parametrize("eos_at", [0, 1, 2, 6, 9])
@pytest.mark.parametrize("cls", [OracleChain, OracleBranched, PromptLookup, RandomTree])
def test_eos_in_the_middle_of_an_accepted_path_stops_there(cls, eos_at):
    # make vanilla's token number `eos_at` the EOS: the oracle accepts drafts past it in the same step, and the
    # engine must emit exactly up to and including the EOS (the first occurrence of that token)
    target = engine_target()
    reference = Vanilla(target).generate(PROMPT, 30, GREEDY).token_ids
    target.eos_ids = frozenset({reference[eos_at]})
    first = reference.index(reference[eos_at])
    method = cls(target)
    got = method.generate(PROMPT, 30, GREEDY)
    assert got.token_ids == reference[: first + 1]
    assert got.stop_reason == "eos"
    check_generation(got, method, PROMPT.shape[1], 30)


def test_max_new_tokens_zero_emits_nothing():
    gen = OracleChain(engine_target()).generate(PROMPT, 0, GREEDY)
    assert gen.token_ids == [] and gen.accept_lengths == []


class SideBranched(OracleChain):
    """A side branch below every root (harness.engine.speculative's ``side_branch``): the target's own greedy
    continuation as a chain, plus a wrong sibling below the root; records the top-1 the engine hands back for each
    side slot beside the argmax of a plain forward over prefix + root + that slot's side path."""

    logit_topk = 1
    draft_depth = 0  # nodes of the oracle chain proposed as the draft (0: an empty draft)

    def propose(self, root, sampling, generator):
        self.root, self.observed = root, self.__dict__.get("observed", [])
        good = self.greedy_continuation(root, 3)
        vocab = self.target.config.vocab_size
        self.side = DraftTree(torch.tensor(good + [(good[0] + 1) % vocab]), torch.tensor([-1, 0, 1, -1]))
        return chain_tree(self.greedy_continuation(root, self.draft_depth) if self.draft_depth else [])

    def side_branch(self):
        return self.side

    def observe(self, slot_ids, top_ids):
        n = slot_ids.shape[0] - 1 - len(self.side)  # draft nodes
        paths = [self.side.tokens[:1], self.side.tokens[:2], self.side.tokens[:3], self.side.tokens[3:]]
        want = [int(self.next_logits(self.context + [self.root] + p.tolist()).argmax()) for p in paths]
        self.observed.append((top_ids[n + 1:, 0].tolist(), want))


@pytest.mark.parametrize("draft_depth", [0, 4])
def test_a_side_branch_is_run_but_never_verified(draft_depth):
    # the side slots are the target's own continuation: a verifier that walked into them would accept them (empty
    # draft: accepted_drafts > 0); a draft slot that saw them, or a side slot at a wrong position or seeing the
    # draft, would change the draft's acceptance or the side's top-1 against a plain forward; K/V left behind
    # would break the cache length check_generation makes
    target = engine_target()
    want = Vanilla(target).generate(PROMPT, 21, GREEDY)
    method = SideBranched(target)
    method.draft_depth = draft_depth
    gen = method.generate(PROMPT, 21, GREEDY)
    assert gen.token_ids == want.token_ids
    assert gen.accepted_drafts == [draft_depth] * len(gen.accepted_drafts)
    assert gen.counters["tree_tokens"] == draft_depth * len(gen.accepted_drafts)  # side slots are not tree tokens
    check_generation(gen, method, PROMPT.shape[1], 21)
    assert len(method.observed) == len(gen.accepted_drafts)
    for got, expected in method.observed:
        assert got == expected


class HiddenRecorder(OracleBranched):
    """Records the hidden states the engine hands over, to compare with a plain forward."""

    needs_hidden_states = True

    def begin(self, prompt_ids, hidden):
        super().begin(prompt_ids, hidden)
        self.features = [hidden]

    def accept(self, tokens, hidden, next_root):
        assert hidden.shape[0] == len(tokens)
        super().accept(tokens, hidden, next_root)
        self.features.append(hidden)


def test_hidden_states_are_post_norm_features_of_committed_tokens():
    # EAGLE/Medusa heads read the input of lm_head at every committed position: from the prefill, then for
    # [root + accepted] of each step (never a rejected branch's)
    target = engine_target()
    method = HiddenRecorder(target)
    gen = method.generate(PROMPT, 21, GREEDY)
    got = torch.cat(method.features)  # [P + committed - ..., H]
    committed = torch.cat([PROMPT, torch.tensor([gen.token_ids[: got.shape[0] - PROMPT.shape[1]]])], dim=1)
    with torch.inference_mode():
        out = target.model(committed, output_hidden_states=True)
    torch.testing.assert_close(got, out.hidden_states[-1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(target.model.lm_head(got), out.logits[0], atol=1e-4, rtol=1e-4)


class LevelRecorder(HiddenRecorder):
    """Reads three hidden-state levels: the embedding output, the input of layer 2 and the post-norm feature."""

    hidden_layers = (0, 2, -1)


def test_declared_hidden_layers_are_handed_over_concatenated():
    # a method that declares hidden_layers (EAGLE-3 fuses three levels) must receive, for exactly the committed
    # positions, those hidden states side by side in the declared order; a wrong index, order or row would differ
    # from a plain forward over the committed text
    target = tiny_target(vocab=64, tokenizer=False, layers=3)
    method = LevelRecorder(target)
    gen = method.generate(PROMPT, 21, GREEDY)
    assert gen.token_ids == Vanilla.create(target).generate(PROMPT, 21, GREEDY).token_ids
    got = torch.cat(method.features)  # [n, 3 * 32]
    committed = torch.cat([PROMPT, torch.tensor([gen.token_ids[: got.shape[0] - PROMPT.shape[1]]])], dim=1)
    with torch.inference_mode():
        states = target.model(committed, output_hidden_states=True).hidden_states
    assert got.shape == (committed.shape[1], 3 * 32)
    torch.testing.assert_close(got, torch.cat([states[0][0], states[2][0], states[3][0]], dim=-1),
                               atol=1e-5, rtol=1e-5)


def test_hidden_layers_out_of_range_are_refused():
    # a level the target does not have must be named before anything runs, not fail inside transformers
    method = LevelRecorder(engine_target())
    method.hidden_layers = (0, 7)
    with pytest.raises(ValueError, match=r"hidden_layers must be non-empty indices of the target's 3 hidden states, "
                                         r"got \(0, 7\)"):
        method.generate(PROMPT, 5, GREEDY)


@pytest.mark.parametrize("spec, layers, expected", [
    ("low,mid,high", 32, (2, 16, 29)),   # EAGLE-3's levels on a 32-layer LLaMA
    ("low,mid,high", 30, (2, 15, 27)),   # SmolLM2-135M
    ("low,mid,high", 2, (1, 1, 1)),      # tiny models: clipped to existing layer inputs, non-decreasing
    ("low,mid,high", 6, (2, 3, 3)),
    ("0, last", 4, (0, -1)),
    ([3, -1], 4, (3, -1)),
])
def test_resolve_hidden_layers_literal(spec, layers, expected):
    # the named levels are the inputs of layers 2, L//2, L-3 (EAGLE-3's modeling_llama_kv); a wrong formula would
    # train and draft on other layers than the published heads read
    assert resolve_hidden_layers(spec, layers) == expected


@pytest.mark.parametrize("spec, message", [("low,top", "'top' is neither an integer nor one of low, mid, high, last"),
                                           ("9", "index 9 is out of range for a target with 4 layers"),
                                           ("", "'' is neither")])
def test_resolve_hidden_layers_names_the_bad_entry(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_hidden_layers(spec, 4)


def test_tree_mask_4d_literal():
    # docstring example: 2 committed positions, two root children that must not see each other
    m = torch.finfo(torch.float32).min
    mask = tree_mask_4d(2, torch.tensor([-1, -1]), torch.float32, torch.device("cpu"))
    assert mask.shape == (1, 1, 3, 5)
    assert mask[0, 0].tolist() == [[0, 0, 0, m, m], [0, 0, 0, 0, m], [0, 0, 0, m, 0]]


def test_bad_prompt_shape_is_refused():
    with pytest.raises(ValueError, match=r"prompt_ids must be \[1, P\]"):
        OracleChain(engine_target()).generate(torch.tensor([1, 2, 3]), 5, GREEDY)


# ---- sampling: the engine must preserve the target distribution ---------------------------------------------------
N_SAMPLES = 1500


class OracleTopK(ContextMethod):
    """Deterministic proposal: the target's own top-2 at the root and top-2 under each (depth 2)."""

    def propose(self, root, sampling, generator):
        seq = self.context + [root]
        first = self.next_logits(seq).topk(2).indices.tolist()
        tokens, parents = list(first), [-1, -1]
        for i, t in enumerate(first):
            for s in self.next_logits(seq + [t]).topk(2).indices.tolist():
                tokens.append(s)
                parents.append(i)
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))


class SampledDraft(ContextMethod):
    """Sampled proposal: 2 root children drawn without replacement from q = softmax(target logits / 2.5), one
    child under each drawn from its own q; ``draft_probs`` carries the q rows."""

    proposal = "sampled"

    def q(self, seq):
        return torch.softmax(self.next_logits(seq) / 2.5, dim=-1)

    def propose(self, root, sampling, generator):
        seq = self.context + [root]
        q0 = self.q(seq)
        first = torch.multinomial(q0, 2, replacement=False, generator=generator)
        rows, second = [q0], []
        for t in first.tolist():
            q1 = self.q(seq + [t])
            rows.append(q1)
            second.append(int(torch.multinomial(q1, 1, generator=generator)))
        rows += [torch.full_like(q0, 1 / q0.numel())] * 2  # leaves: never used
        return DraftTree(torch.cat([first, torch.tensor(second)]), torch.tensor([-1, -1, 0, 1]), torch.stack(rows))


class TypicalOracle(OracleTopK):
    """A deliberately lossy verifier (Medusa's typical acceptance): the chi-square test must reject it."""

    def verify(self, tree, logits, sampling, generator):
        return verify_typical(tree, logits, sampling, generator=generator)


class RandomSmallTree(RandomTree):
    size = 5


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
@pytest.mark.parametrize("cls", [OracleTopK, RandomSmallTree, SampledDraft], ids=lambda c: c.__name__)
def test_sampling_matches_the_target_distribution(cls, sampling):
    # the first three tokens come from prefill + tree verification (+ a second step when little is accepted);
    # any bias in acceptance, residuals, bonus sampling, positions or cache shows up in their joint distribution
    assert sampled_pvalue(cls(sampling_target()), sampling, N_SAMPLES) > 1e-3


@pytest.mark.slow
def test_sampling_test_detects_a_lossy_verifier():
    # the same statistic on Medusa's typical acceptance must fail, or the test above could not fail either
    assert sampled_pvalue(TypicalOracle(sampling_target()), SamplingParams(temperature=1.0), N_SAMPLES) < 1e-6
