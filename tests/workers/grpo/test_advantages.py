import pytest
import torch

from workers.grpo.advantages import group_advantages, zero_std_group_fraction


def test_worked_example_population_std() -> None:
    # mean 0.25; population std sqrt((0.75^2 + 3 * 0.25^2) / 4) = 0.433
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    assert adv.tolist() == pytest.approx([1.732, -0.577, -0.577, -0.577], abs=2e-3)
    assert adv[0].item() == pytest.approx(0.75 / (0.4330127 + 1e-4), rel=1e-6)


def test_worked_example_sample_std() -> None:
    # sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, std="sample")
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-3)


def test_no_std_division_is_centering_only() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, std="none")
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


@pytest.mark.parametrize("std", ["population", "sample", "none"])
def test_equal_rewards_give_zero_advantage(std: str) -> None:
    adv = group_advantages(torch.full((4,), 0.7), 4, std=std)
    assert adv.abs().max().item() < 1e-5


def test_groups_are_normalised_separately() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0, 0.0, 2.0, 0.0, 2.0])
    adv = group_advantages(rewards, 4)
    assert adv[:4].tolist() == pytest.approx([1.732, -0.577, -0.577, -0.577], abs=2e-3)
    assert adv[4:8].tolist() == [0.0] * 4
    assert adv[8:].tolist() == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-3)


def test_zero_std_group_fraction() -> None:
    rewards = torch.tensor([1.0, 0.0, 5.0, 5.0, 0.0, 0.0, 2.0, 3.0])
    assert zero_std_group_fraction(rewards, 2) == 0.5
    assert zero_std_group_fraction(rewards, 4) == 0.0
