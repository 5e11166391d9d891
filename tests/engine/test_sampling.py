"""accept() emits exactly the target's distribution; process_logits keeps the right support.

Each case draws B = 100 000 rows in one call with a seeded generator and runs a chi-square
goodness-of-fit test against the target distribution. Deliberately wrong samplers run through
the same check and must fail it, so the check has power.
"""

from __future__ import annotations

import pytest
import torch

from engine.sampling import accept, process_logits, sample

V = 10
B = 100_000
P_OK = 1e-3


def dist(seed: int, support: list[int] | None = None, peak: float = 1.5) -> torch.Tensor:
    """A fixed random distribution over V tokens, zero outside ``support``."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=gen) * peak
    if support is not None:
        mask = torch.full((V,), float("-inf"))
        mask[support] = 0.0
        logits = logits + mask
    return logits.softmax(-1)


def draw(probs: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs, n, replacement=True, generator=gen)


def run_accept(target_list, draft_list, seed=0, deterministic=False, sampler=accept):
    """B rows, G = len(draft_list) positions; returns (draft_tokens, n_acc, next_token)."""
    gen = torch.Generator().manual_seed(seed)
    g = len(draft_list)
    draft_tokens = (
        torch.stack([draw(q, B, gen) for q in draft_list], 1) if g else torch.zeros(B, 0, dtype=torch.long)
    )
    draft_probs = None if deterministic else torch.stack(draft_list)[None].expand(B, g, V)
    target_probs = torch.stack(target_list)[None].expand(B, g + 1, V)
    n_prop = torch.full((B,), g, dtype=torch.long)
    n_acc, nxt = sampler(draft_tokens, draft_probs, target_probs, n_prop, gen)
    return draft_tokens, n_acc, nxt


def emitted_at(draft_tokens, n_acc, nxt, j: int) -> torch.Tensor:
    """Token emitted at block position j by the rows that reach it (all earlier drafts accepted)."""
    tok = nxt if j >= draft_tokens.shape[1] else torch.where(n_acc > j, draft_tokens[:, j], nxt)
    return tok[n_acc >= j]


def wrong_always_draft(draft_tokens, draft_probs, target_probs, n_proposed, generator):
    """Emits the draft token unconditionally (a drafter-only sampler)."""
    n = n_proposed.clone()
    return n, sample(target_probs[torch.arange(n.shape[0]), n], generator)


def wrong_resample_target(draft_tokens, draft_probs, target_probs, n_proposed, generator):
    """Right acceptance test, but recovers from target_probs instead of max(0, p - q)."""
    b, g = draft_tokens.shape
    p_at = target_probs[:, :g].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_at = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    u = torch.rand(b, g, generator=generator, dtype=torch.float64)
    n_acc = (u * q_at < p_at).long().cumprod(-1).sum(-1)
    return n_acc, sample(target_probs[torch.arange(b), n_acc], generator)


# ------------------------------------------------------------------ one position (G = 1)


@pytest.mark.parametrize("case", ["overlap", "equal", "disjoint", "partial"])
def test_first_token_has_target_distribution(chi2, case):
    p = {
        "overlap": dist(1),
        "equal": dist(1),
        "disjoint": dist(1, [0, 1, 2, 3, 4]),
        "partial": dist(1, [0, 1, 2, 3, 4, 5, 6]),
    }[case]
    q = {
        "overlap": dist(2),
        "equal": p,
        "disjoint": dist(2, [5, 6, 7, 8, 9]),
        "partial": dist(2, [3, 4, 5, 6, 7, 8, 9]),
    }[case]
    drafts, n_acc, nxt = run_accept([p, dist(3)], [q])
    first = emitted_at(drafts, n_acc, nxt, 0)
    assert first.numel() == B
    assert not bool(torch.isin(first, torch.nonzero(p == 0).flatten()).any()), "emitted a token with p = 0"
    assert chi2(first, p) > P_OK
    # Acceptance probability is sum_x min(p(x), q(x)) (Leviathan et al., Thm 3.5).
    alpha = float(torch.minimum(p, q).sum())
    rate = float((n_acc == 1).double().mean())
    assert abs(rate - alpha) < 5 * (alpha * (1 - alpha) / B) ** 0.5 + 1e-12
    if case == "equal":
        assert bool((n_acc == 1).all())
    if case == "disjoint":
        assert bool((n_acc == 0).all())


@pytest.mark.parametrize("wrong", [wrong_always_draft, wrong_resample_target])
def test_wrong_samplers_fail_the_same_check(chi2, wrong):
    p, q = dist(1), dist(2)
    drafts, n_acc, nxt = run_accept([p, dist(3)], [q], sampler=wrong)
    assert chi2(emitted_at(drafts, n_acc, nxt, 0), p) < P_OK


def test_deterministic_drafter_first_token_has_target_distribution(chi2):
    p = dist(4)
    proposal_source = dist(5, peak=3.0)  # the drafter's (unknown to accept) way of picking tokens
    drafts, n_acc, nxt = run_accept([p, dist(6)], [proposal_source], deterministic=True)
    first = emitted_at(drafts, n_acc, nxt, 0)
    assert chi2(first, p) > P_OK
    # A one-hot q accepts x with probability p(x).
    assert abs(float((n_acc == 1).double().mean()) - float((p * proposal_source).sum())) < 0.01
    assert chi2(drafts[:, 0], p) < P_OK  # the proposals alone are off-distribution


# ------------------------------------------------------------------ chained (G = 3)


@pytest.mark.parametrize("deterministic", [False, True])
def test_chained_positions_each_have_target_distribution(chi2, deterministic):
    targets = [dist(10 + j) for j in range(4)]  # 3 draft positions + bonus, independent
    if deterministic:  # proposals near the target's mode, so a one-hot q is often accepted
        drafts_q = [targets[j] ** 4 / (targets[j] ** 4).sum() for j in range(3)]
    else:
        drafts_q = [perturb_toward(targets[j], dist(20 + j), 0.6) for j in range(3)]
    drafts, n_acc, nxt = run_accept(targets, drafts_q, seed=1, deterministic=deterministic)
    for j in range(4):
        tok = emitted_at(drafts, n_acc, nxt, j)
        assert tok.numel() > 5_000, f"too few rows reach position {j}"
        assert chi2(tok, targets[j]) > P_OK, f"position {j}"
    # Rows reaching position 1 accepted draft 0, which is then distributed as min(p, q) (one-hot q:
    # proposal * p); the token at position 1 is independent of it and follows p1.
    reach = n_acc >= 1
    accepted0 = drafts_q[0] * targets[0] if deterministic else torch.minimum(drafts_q[0], targets[0])
    pair_tok = drafts[reach, 0] * V + emitted_at(drafts, n_acc, nxt, 1)
    assert chi2(pair_tok, torch.outer(accepted0, targets[1]).flatten()) > P_OK


def test_chained_check_fails_for_a_wrong_sampler(chi2):
    targets = [dist(10 + j) for j in range(4)]
    drafts_q = [perturb_toward(targets[j], dist(20 + j), 0.6) for j in range(3)]
    drafts, n_acc, nxt = run_accept(targets, drafts_q, seed=1, sampler=wrong_resample_target)
    assert min(chi2(emitted_at(drafts, n_acc, nxt, j), targets[j]) for j in range(4)) < P_OK


def perturb_toward(p: torch.Tensor, other: torch.Tensor, w: float) -> torch.Tensor:
    return (1 - w) * p + w * other


def test_rows_with_fewer_proposals_get_bonus_from_their_own_position(chi2):
    """n_proposed < G: a row with all its proposals accepted samples the bonus at n_proposed."""
    p0, p1, p2 = dist(30), dist(31), dist(32)
    gen = torch.Generator().manual_seed(3)
    drafts = torch.stack([draw(p0, B, gen), draw(p1, B, gen)], 1)
    target_probs = torch.stack([p0, p1, p2])[None].expand(B, 3, V)
    draft_probs = torch.stack([p0, p1])[None].expand(B, 2, V)  # q == p: everything proposed is accepted
    n_prop = torch.ones(B, dtype=torch.long)
    n_acc, nxt = accept(drafts, draft_probs, target_probs, n_prop, gen)
    assert bool((n_acc == 1).all())
    assert chi2(nxt, p1) > P_OK


# ------------------------------------------------------------------ process_logits


def test_top_k_keeps_exactly_k_tokens():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 2, V, generator=gen)
    probs = process_logits(logits, torch.ones(6), top_k=torch.tensor([3, 3, 1, 0, V, 20]))
    kept = (probs > 0).sum(-1)
    assert kept.tolist() == [[3, 3], [3, 3], [1, 1], [V, V], [V, V], [V, V]]
    top3 = logits[0].topk(3, -1).indices
    torch.testing.assert_close(probs[0].gather(-1, top3), logits[0].gather(-1, top3).softmax(-1))


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_top_p_keeps_the_minimal_nucleus_after_temperature(top_p, temperature):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 1, V, generator=gen) * 2
    probs = process_logits(logits, torch.full((8,), temperature), top_p=torch.full((8,), top_p))
    full = (logits / temperature).softmax(-1)
    for b in range(8):
        sorted_p, order = full[b, 0].sort(descending=True)
        m = int((sorted_p.cumsum(0) < top_p).sum()) + 1  # smallest prefix with mass >= top_p
        kept = set(torch.nonzero(probs[b, 0]).flatten().tolist())
        assert kept == set(order[:m].tolist())
        torch.testing.assert_close(probs[b, 0, order[:m]], sorted_p[:m] / sorted_p[:m].sum())


def test_top_k_and_top_p_sampling_stays_in_target_support(chi2):
    gen = torch.Generator().manual_seed(2)
    t_logits, d_logits = torch.randn(1, 2, V, generator=gen) * 1.5, torch.randn(1, 1, V, generator=gen) * 1.5
    for kw in ({"top_k": torch.tensor([4])}, {"top_p": torch.tensor([0.7])}):
        p = process_logits(t_logits, torch.ones(1), **kw)[0]  # (2, V)
        q = process_logits(d_logits, torch.ones(1), **kw)[0, 0]
        assert bool(((p[0] > 0) != (q > 0)).any())  # the draft keeps some token the target drops
        drafts, n_acc, nxt = run_accept([p[0], p[1]], [q], seed=4)
        first = emitted_at(drafts, n_acc, nxt, 0)
        assert bool((p[0][first] > 0).all()), f"token outside the target's kept support ({kw})"
        assert chi2(first, p[0]) > P_OK


def test_greedy_rows_emit_the_target_argmax_in_a_mixed_batch(chi2):
    gen = torch.Generator().manual_seed(5)
    t_logits = torch.randn(1, 2, V, generator=gen).expand(B, 2, V)
    d_logits = torch.randn(1, 1, V, generator=gen).expand(B, 1, V)
    temperature = torch.where(torch.arange(B) % 2 == 0, 0.0, 1.0)  # even rows greedy
    p = process_logits(t_logits, temperature)
    q = process_logits(d_logits, temperature)
    greedy = temperature == 0
    assert torch.equal(
        p[greedy], torch.zeros_like(p[greedy]).scatter_(-1, t_logits[greedy].argmax(-1, keepdim=True), 1.0)
    )
    drafts = sample(q[:, 0], gen)[:, None]  # greedy rows propose the draft argmax
    n_acc, nxt = accept(drafts, q, p, torch.ones(B, dtype=torch.long), gen)
    first = torch.where(n_acc > 0, drafts[:, 0], nxt)
    target_argmax = int(t_logits[0, 0].argmax())
    assert int(d_logits[0, 0].argmax()) != target_argmax  # so greedy rows reject and recover
    assert bool((first[greedy] == target_argmax).all())
    assert bool((n_acc[greedy] == 0).all())
    assert chi2(first[~greedy], t_logits[0, 0].softmax(-1)) > P_OK


def test_greedy_accepts_draft_equal_to_target_argmax():
    p = torch.zeros(4, 3, V)
    p[:, 0, 2], p[:, 1, 7], p[:, 2, 1] = 1.0, 1.0, 1.0  # target argmax: 2, then 7, then bonus 1
    drafts = torch.tensor([[2, 7], [2, 5], [4, 7], [2, 7]])
    n_prop = torch.tensor([2, 2, 2, 1])
    n_acc, nxt = accept(drafts, None, p, n_prop, torch.Generator().manual_seed(0))
    assert n_acc.tolist() == [2, 1, 0, 1]
    assert nxt.tolist() == [1, 7, 2, 7]


def test_sample_follows_probs(chi2):
    probs = dist(40)
    gen = torch.Generator().manual_seed(6)
    assert chi2(sample(probs.expand(B, V), gen), probs) > P_OK
    assert chi2(sample(probs.expand(B, V), gen), dist(41)) < P_OK


@pytest.mark.parametrize(("top_p", "kept"), [(0.25, 2), (0.5, 4), (0.75, 6), (1.0, 8)])
def test_top_p_boundary_mass_exactly_reached_keeps_no_extra_token(top_p, kept):
    """Uniform over 8 tokens (exact eighths): the nucleus reaching top_p exactly stops there."""
    probs = process_logits(torch.zeros(1, 1, 8), torch.ones(1), top_p=torch.tensor([top_p]))
    assert int((probs > 0).sum()) == kept
    torch.testing.assert_close(probs[probs > 0], torch.full((kept,), 1 / kept))
