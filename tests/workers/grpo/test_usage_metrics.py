"""The token counts a step reports for usage (docs/usage.md), worked out from its rollouts."""

from transformers import AutoTokenizer

from workers.grpo.config import TrainSpec
from workers.grpo.trainer import TrainHooks, train


def test_a_step_counts_its_sampled_and_trained_tokens(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    grpo = {"steps": 1, "prompts_per_step": 2, "group_size": 4, "num_iterations": 2}
    spec = TrainSpec(base_model=str(tiny_model), grpo=grpo, generation={"max_new_tokens": 8})
    metrics: dict[str, float] = {}
    rows: list[dict] = []
    hooks = TrainHooks(
        on_step=lambda _step, m: metrics.update(m),
        on_rollouts=lambda _step, _split, r: rows.extend(r),
    )
    train(spec, digit_records, [digit_scorer], tmp_path, hooks, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt_tokens = sum(
        len(tokenizer(digit_records[r["record"]]["prompt"]).input_ids) for r in rows
    )
    completion_tokens = sum(r["length"] for r in rows)
    assert len(rows) == 8 and completion_tokens > 0
    assert metrics["completion_tokens"] == completion_tokens  # no refills: the trained batch
    assert metrics["completion_tokens"] == metrics["completion_len_mean"] * 8
    # Every completion token carries loss (truncated ones too, by default), twice (mu = 2).
    assert metrics["trained_tokens"] == 2 * (prompt_tokens + completion_tokens)
