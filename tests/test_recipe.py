"""engine/recipe.py at its edges, each found by a mutant the suite let through: which terms a coefficient of exactly 0
turns off, what a population's members must share, a controller asked about a run without KL, the metrics a filter
and a token-level delta report, and a member's own NLL weight."""
import pytest
import torch

from grpo_bench.algos import Batch
from grpo_bench.config.run import resolve_run
from grpo_bench.engine.recipe import Recipe


def recipe(**cfg) -> Recipe:
    return Recipe(resolve_run(cfg))


@pytest.mark.parametrize("key, flag", [("entropy_coef", "use_entropy"), ("nll_coef", "use_nll")])
def test_a_coefficient_of_zero_is_no_term_and_any_other_is_one(key, flag):
    assert getattr(recipe(**{key: 0.0}), flag) is False
    assert getattr(recipe(**{key: 0.005}), flag) is True   # the small bonuses papers use, under 1


def test_kl_sits_where_it_is_placed_and_nowhere_at_zero():
    r = recipe(kl_coef=0.0, kl_placement="reward")
    assert (r.kl_in_reward, r.kl_in_loss, r.use_ref) == (False, False, False)
    r = recipe(kl_coef=0.05, kl_placement="reward")
    assert (r.kl_in_reward, r.kl_in_loss, r.use_ref) == (True, False, True)
    r = recipe(kl_coef=0.05, kl_placement="loss")
    assert (r.kl_in_reward, r.kl_in_loss, r.loss_ref) == (False, True, True)


def test_members_share_whether_a_term_is_on_not_its_size():
    """A population vmaps one code path: kl 0.05 and 0.1 may train together, 0 and 0.05 may not (one has no
    reference pass); the same for gradient clipping, whose 0 means none."""
    s = lambda **c: recipe(**c).structure()  # noqa: E731
    assert s(kl_coef=0.05) == s(kl_coef=0.1) and s(kl_coef=0.0) != s(kl_coef=0.05)
    assert s(max_grad_norm=0.5) == s(max_grad_norm=1.0) and s(max_grad_norm=0.0) != s(max_grad_norm=1.0)
    assert s(nll_coef=0.1) == s(nll_coef=0.2) != s(nll_coef=0.0)


def test_a_run_without_a_reference_never_mixes_one_in():
    r = recipe(kl_coef=0.0, ref_update={"name": "hard", "every": 1})
    assert [r.ref_weight(e) for e in range(3)] == [0.0, 0.0, 0.0]
    r = recipe(kl_coef=0.05, ref_update={"name": "hard", "every": 1})
    assert r.ref_weight(1) == 1.0


def test_a_controller_is_not_asked_about_a_run_without_kl():
    """A KL controller that would move any coefficient (a user's part) leaves a run with kl_coef 0 at 0."""
    r = recipe(kl_coef=0.0)
    r.parts["kl_ctrl"] = lambda coef, observed, n: coef + 1.0
    assert r.next_kl_coef(0.3, 64) == 0.0
    r = recipe(kl_coef=0.05)
    r.parts["kl_ctrl"] = lambda coef, observed, n: coef + 1.0
    assert r.next_kl_coef(0.3, 64) == pytest.approx(1.05)


def _batch(rewards, mask):
    rewards, mask = torch.as_tensor(rewards).clone(), torch.as_tensor(mask).clone()   # lists or tensors
    return Batch(rewards, mask, mask.sum(-1), torch.ones_like(rewards, dtype=torch.bool), mask.shape[-1])


def test_a_retiring_filter_reports_the_share_of_prompts_it_retired():
    r = recipe(filters=[{"name": "no_positive_resample", "threshold": 0.9}])
    b = _batch([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], [[[1.0, 1.0]] * 2] * 4)
    out, metrics = r.filter_rollout(b)
    assert out.retire.tolist() == [True, False, True, False]
    assert metrics["filter/no_positive_resample/retired"].item() == 0.5
    again, metrics = r.filter_rollout(out)   # the batch came retired: this filter retired no more than it had
    assert metrics["filter/no_positive_resample/retired"].item() == 0.5


def test_token_level_deltas_report_their_mean_over_the_tokens_that_count():
    r = recipe()
    r.parts["delta"] = lambda rewards, lengths, greedy, components, extra, numbers=None: torch.tensor(
        [[[1.0, 3.0, 100.0], [2.0, 2.0, 2.0]]])                     # (B, G, T), a padded 100 under the mask
    mask = torch.tensor([[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]])
    _, metrics = r.advantages(_batch([[1.0, 0.0]], mask))
    assert metrics["delta/abs_mean"].item() == pytest.approx(2.0)   # (1 + 3 + 2 + 2 + 2) / 5


def test_a_members_nll_weight_is_its_own_and_none_needs_no_numbers():
    r = recipe(nll_coef=0.1)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(1, 2, 3, generator=g) - 0.1
    mask, deltas = torch.ones(1, 2, 3), torch.tensor([[1.0, -1.0]])
    base, _ = r.loss(logp, logp, None, deltas, mask)   # numbers=None: the run's own 0.1
    same, _ = r.loss(logp, logp, None, deltas, mask, numbers={"nll_coef": 0.1})
    more, _ = r.loss(logp, logp, None, deltas, mask, numbers={"nll_coef": 0.5})
    assert same == base
    # the NLL term is -coef x the mean log-prob of the positive responses' tokens: 0.4 more of it
    nll = -logp[0, 0].mean()
    assert (more - base).item() == pytest.approx(0.4 * nll.item(), rel=1e-5)


def test_the_entropy_bonus_takes_the_members_coefficient_or_the_controllers():
    """Without a coefficient given, the controller's current one; given (a population member's), that one: the bonus
    is -coef x the token mean of the entropy."""
    r = recipe(entropy_coef=0.01)
    g = torch.Generator().manual_seed(1)
    logp, ent = -torch.rand(1, 2, 3, generator=g) - 0.1, torch.rand(1, 2, 3, generator=g)
    mask, deltas = torch.ones(1, 2, 3), torch.tensor([[1.0, -1.0]])
    plain, _ = recipe().loss(logp, logp, None, deltas, mask)
    own, _ = r.loss(logp, logp, None, deltas, mask, entropy=ent)
    given, _ = r.loss(logp, logp, None, deltas, mask, entropy=ent, entropy_coef=0.05)
    assert (own - plain).item() == pytest.approx(-0.01 * ent.mean().item(), rel=1e-5)
    assert (given - plain).item() == pytest.approx(-0.05 * ent.mean().item(), rel=1e-5)
