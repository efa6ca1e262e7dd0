"""Text envs through the real trainer: CLI run, HF model dir reload, resume, a short learning test."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TINY_LM, needs

#: the text env kind builds its model and tokenizer with the text extra
text_extra = needs("transformers", "tokenizers", extra="text")

# Small and fast: 4 groups x 4 completions per update, 3-token completions.
FAST = [
    "algo.num_groups=4",
    "algo.group_size=4",
    *TINY_LM,
    "log.tensorboard=false",
    "text.log_completions_every=1",
    "threads=1",
    "algo.zero_std=keep",  # fixed completions per update, so step counts below are exact (arithmetic resamples)
]


@text_extra
def test_cli_arithmetic_trains_saves_and_reloads(
    run_cli: Callable[..., Any], train: Callable[..., dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "arith"
    proc = run_cli("env=arithmetic", "total_steps=64", "eval.every_steps=32", *FAST, run_dir=run_dir)
    assert "accuracy" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 64 and summary["updates"] == 4
    assert 0.0 <= summary["eval/accuracy"] <= 1.0 and summary["eval/episodes"] == 100
    model_dir = Path(summary["model_dir"])
    assert (model_dir / "config.json").exists() and (model_dir / "tokenizer.json").exists()
    # Completions are appended, one line per logged sample, each naming its update.
    lines = [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*metrics)
    for key in (
        "rollout/accuracy",
        "rollout/reward/int_match",
        "rollout/completion_len_mean",
        "rollout/frac_zero_std_groups",
        "train/clip_fraction",
        "train/entropy",
        "eval/accuracy",
    ):
        assert key in keys, key
    # The saved directory is an ordinary HF model: model.path= reloads it (same eval result).
    capsys.readouterr()
    reloaded = train(
        tmp_path / "again", "env=arithmetic", f"model.path={model_dir}", "total_steps=16", "algo.lr=1e-12", *FAST
    )
    # arithmetic's tuned defaults stop at its threshold, which 16 steps never evaluate: said, not refused
    assert (
        "note: train.stop_on_threshold=true is the env default, but eval.every_steps=20480 is larger than "
        "total_steps=16, so no evaluation runs before the end"
    ) in capsys.readouterr().err
    assert reloaded["eval/accuracy"] == summary["eval/accuracy"]
    # evaluate: one held-out prompt is one episode; asking for more than the split holds is refused
    proc = run_cli(f"run={run_dir}", "episodes=101", module="grpo_marl.evaluate", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: episodes=101 but {run_dir} evaluates on a held-out split of 100 prompts (one prompt is one "
        "episode); pass episodes<=100, or omit episodes to evaluate the run's own number (text.eval_prompts)"
    )
    assert not (run_dir / "eval.json").exists()
    run_cli(f"run={run_dir}", "episodes=7", module="grpo_marl.evaluate")
    assert json.loads((run_dir / "eval.json").read_text())["eval/episodes"] == 7


@text_extra
def test_quadratic_and_jsonl_run(train: Callable[..., dict], tmp_path: Path) -> None:
    s = train(tmp_path / "quad", "env=quadratic", "total_steps=32", "text.eval_prompts=8", "text.sft_steps=20", *FAST)
    assert s["text/sft_steps"] == 20  # the default warm start runs (shortened here)
    assert s["eval/episodes"] == 8 and "eval/reward/quadratic_roots" in s
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(10)))
    s = train(tmp_path / "jsonl", "env=text_jsonl", f"+env_kwargs.path={data}", "total_steps=32", *FAST)
    assert s["text/task"] == "jsonl:d.jsonl" and s["eval/episodes"] == 1


@text_extra
def test_resume_is_exact(train: Callable[..., dict], tmp_path: Path, load_checkpoint: Callable) -> None:
    common = ["env=arithmetic", "checkpoint.every=1", *FAST]
    full = train(tmp_path / "full", *common, "total_steps=48")
    train(tmp_path / "half", *common, "total_steps=32")
    resumed = train(tmp_path / "half", f"resume={tmp_path / 'half'}", "total_steps=48")
    assert resumed["env_steps"] == full["env_steps"] == 48
    a = load_checkpoint(tmp_path / "full")["modules"]["policy"]
    b = load_checkpoint(tmp_path / "half")["modules"]["policy"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)


@text_extra
def test_config_errors_are_actionable(run_cli: Callable[..., Any]) -> None:
    proc = run_cli("env=arithmetic", "text.temperature=0", "algo.advantage=rtg", check=False)
    assert proc.returncode == 2
    assert "text.temperature" in proc.stderr and "algo.advantage=outcome" in proc.stderr


@text_extra
@pytest.mark.parametrize("seed", [1])
def test_learns_three_prompt_task(train: Callable[..., dict], tmp_path: Path, seed: int) -> None:
    """From a random init, GRPO alone reaches 100% greedy accuracy on a 3-prompt task."""
    data = tmp_path / "three.jsonl"
    rows = [{"prompt": "a=", "answer": "7"}, {"prompt": "b=", "answer": "3"}, {"prompt": "c=", "answer": "5"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = train(
        tmp_path / "learn",
        "env=text_jsonl",
        f"+env_kwargs.path={data}",
        f"+env_kwargs.eval_path={data}",
        "+env_kwargs.alphabet='abc=0123456789'",
        f"seed={seed}",
        "algo.num_groups=3",
        "algo.group_size=16",
        "algo.lr=3e-3",
        "algo.beta=0",
        "total_steps=9600",
        "eval.every_steps=480",
        "train.stop_on_threshold=true",
        "train.threshold=1.0",
        *TINY_LM,
        "log.tensorboard=false",
        "checkpoint.every=0",
        "threads=1",
    )
    assert s["eval/accuracy"] == 1.0, s
    assert s["steps_to_threshold"] is not None


@text_extra
def test_task_batch_layout_and_truncation_mask(resolve: Callable[[list[str]], Any]) -> None:
    """Fixed widths (so dynamic-sampling batches concatenate), reward on each completion's last
    valid token, and text.mask_truncated drops completions without EOS from the loss mask."""
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.text import TextTask

    cfg = resolve(["env=quadratic", "text.max_new_tokens=3", "text.mask_truncated=true", "text.sft_steps=0", *FAST])
    task = TextTask(cfg, get_spec("quadratic"), torch.device("cpu"))
    batch = task.collect(task.policy)
    b = cfg.algo.num_groups * cfg.algo.group_size
    assert batch["input_ids"].shape == (b, task.prompt_width + 3)
    assert batch["completion_mask"].shape == batch["mask"].shape == batch["rewards"].shape == (b, 3)
    cm = batch["completion_mask"].bool()
    ends_with_eos = (batch["input_ids"][:, -3:] == task.policy.eos_id).any(1)
    # No quadratic answer fits in 3 tokens: truncated rows carry no loss mask and no reward.
    assert torch.equal(batch["mask"].any(1), ends_with_eos)
    assert (batch["rewards"][~ends_with_eos] == 0).all()
    assert (batch["mask"] <= cm).all()
    logp, ent = task.log_prob(task.policy, {k: batch[k] for k in TextTask.input_keys}, need_entropy=False)
    torch.testing.assert_close(logp * cm, batch["logp"], atol=1e-5, rtol=1e-5)
    assert ent is not None and not ent.requires_grad
    task.close()


@text_extra
def test_sft_warm_start_fits_answers_and_applies_weight_decay(resolve: Callable[[list[str]], Any]) -> None:
    """The supervised warm start lowers the answers' NLL from its untrained value, and its
    decoupled weight decay (text.sft_weight_decay) leaves smaller weights than none."""
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.text import TextTask

    def warm(decay: float) -> tuple[TextTask, float]:
        cfg = resolve(
            ["env=arithmetic", "text.sft_steps=30", "text.sft_lr=0.01", f"text.sft_weight_decay={decay}", *FAST]
        )
        torch.manual_seed(0)
        task = TextTask(cfg, get_spec("arithmetic"), torch.device("cpu"))
        norm = float(sum(p.detach().pow(2).sum() for p in task.policy.parameters()))
        return task, norm

    plain, norm_plain = warm(0.0)
    decayed, norm_decayed = warm(1.0)
    assert decayed.sft_stats["text/sft_steps"] == 30
    assert plain.sft_stats["text/sft_steps"] == 30
    assert plain.sft_stats["text/sft_final_nll"] < 1.5  # untrained: ~ln(13) = 2.6 nats per token
    assert norm_decayed < norm_plain


def test_sft_weight_decay_must_be_non_negative(run_cli: Callable[..., Any]) -> None:
    proc = run_cli("env=quadratic", "text.sft_weight_decay=-0.1", check=False)
    assert proc.returncode == 2 and "text.sft_weight_decay=-0.1 must be >= 0" in proc.stderr


def test_prompt_sampling_is_checked_before_training(run_cli: Callable[..., Any]) -> None:
    proc = run_cli("env=arithmetic", "text.prompt_sampling=worst", "text.hard_floor=0", check=False)
    assert proc.returncode == 2
    line = next(x for x in proc.stderr.splitlines() if "text.prompt_sampling=" in x)
    assert "worst" in line and "choose one of uniform, hard" in line
    assert "text.hard_floor=0 must be > 0" in proc.stderr


@text_extra
def test_rollouts_without_signal_are_not_scored_and_the_gradient_is_unchanged(
    resolve: Callable[[list[str]], Any],
) -> None:
    """GRPO drops zero-advantage rollouts from a minibatch before scoring it (no KL, no entropy
    bonus): the loss and every parameter's gradient equal those of the whole minibatch."""
    from grpo_marl.algos import make_algo
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.text import TextTask

    cpu = torch.device("cpu")
    cfg = resolve(["env=arithmetic", *FAST, "algo.entropy_coef=0"])  # (arithmetic's default has a bonus)
    task = TextTask(cfg, get_spec("arithmetic"), cpu)
    algo = make_algo("grpo", cfg.algo, task, cpu)
    data, _ = algo.prepare(task.collect(task.policy))
    assert data is not None
    g = int(cfg.algo.group_size)
    adv = torch.zeros_like(data["advantages"])  # groups 0 and 2 all-equal, 1 and 3 with signal
    spread = torch.linspace(-1.0, 1.0, g)[:, None].expand(g, adv.shape[1])
    adv[g : 2 * g] = spread
    adv[3 * g : 4 * g] = -spread
    data["advantages"] = adv
    live = (adv != 0).any(1)
    assert int(live.sum()) == 2 * g
    params = [p for p in task.policy.parameters() if p.requires_grad]

    def backward(loss: torch.Tensor) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        loss.backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    sub = algo.rows_with_signal(data)
    assert sub["input_ids"].shape[0] == 2 * g and torch.equal(sub["advantages"], data["advantages"][live])
    out = algo.loss(data)
    grads = backward(out["loss"])
    logp, _ = task.log_prob(task.policy, data, need_entropy=False)
    weights = data["weights"] * float(algo.minibatches)
    whole = algo.loss_fn(logp, data["logp"], data["advantages"], weights, mask=data["mask"])
    whole_grads = backward(whole["loss"])
    torch.testing.assert_close(out["loss"], whole["loss"], atol=1e-7, rtol=1e-5)
    assert any(bool(w.abs().sum() > 0) for w in whole_grads)
    for a, b in zip(grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    # nothing to learn from: one row is kept so the optimizer still steps on a zero gradient
    none = {**data, "advantages": torch.zeros_like(data["advantages"])}
    assert algo.rows_with_signal(none)["input_ids"].shape[0] == 1
    # a KL term or an entropy bonus acts on every row: nothing is dropped
    with_kl = {**data, "ref_logp": data["logp"]}
    assert algo.rows_with_signal(with_kl) is with_kl
    algo.cfg.entropy_coef = 0.01
    assert algo.rows_with_signal(data) is data
    task.close()


def _prepared_grpo(resolve: Callable[[list[str]], Any], override: str) -> tuple[Any, Any, Any, dict]:
    """GRPO on a tiny arithmetic task (no entropy bonus) and one prepared batch."""
    from grpo_marl.algos import make_algo
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.text import TextTask

    cpu = torch.device("cpu")
    cfg = resolve(["env=arithmetic", *FAST, "algo.entropy_coef=0", override])
    task = TextTask(cfg, get_spec("arithmetic"), cpu)
    algo = make_algo("grpo", cfg.algo, task, cpu)
    data, _ = algo.prepare(task.collect(task.policy))
    assert data is not None
    return cfg, task, algo, data


@text_extra
def test_micro_batches_add_up_to_the_minibatch_loss_and_gradient(resolve: Callable[[list[str]], Any]) -> None:
    """``algo.micro_batch_rows``: the pieces' losses and gradients sum to the whole minibatch's,
    each piece holds whole groups where it can (rows ordered by group), and the merged mean
    statistics equal the minibatch's."""
    from grpo_marl.trainer import merge_terms

    cfg, task, algo, data = _prepared_grpo(resolve, "algo.micro_batch_rows=3")
    g, b = int(cfg.algo.group_size), data["advantages"].shape[0]
    gen = torch.Generator().manual_seed(0)
    data["advantages"] = torch.randn(data["advantages"].shape, generator=gen) * data["mask"]
    data["logp"] = data["logp"] + 0.05 * torch.randn(data["logp"].shape, generator=gen)  # ratios != 1
    shuffled = torch.randperm(b, generator=gen)  # a minibatch's rows arrive in random order
    mb = {k: v.index_select(0, shuffled) for k, v in data.items()}
    params = [p for p in task.policy.parameters() if p.requires_grad]

    def grads() -> list[torch.Tensor]:
        out = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return out

    whole = algo.loss(mb)
    whole["loss"].backward()
    whole_grads = grads()
    pieces = algo.micro_batches(mb)
    assert len(pieces) == -(-b // 3) and sum(p["input_ids"].shape[0] for p, _ in pieces) == b
    assert abs(sum(share for _, share in pieces) - 1.0) < 1e-6
    # ordered by group: a piece's groups are consecutive, and no group is split more than needed
    for piece, _ in pieces:
        groups = piece["group"]
        assert torch.equal(groups, groups.sort().values) and int(groups.max() - groups.min()) <= 1 + 3 // g
    parts = []
    for piece, share in pieces:
        terms = algo.loss(piece)
        terms["loss"].backward()
        parts.append(({k: v.detach() for k, v in terms.items()}, share))
    merged = merge_terms(parts)
    for a, c in zip(grads(), whole_grads, strict=True):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-4)
    for name in ("loss", "loss_policy", "clip_fraction", "approx_kl", "ratio_mean", "ratio_max", "entropy"):
        torch.testing.assert_close(merged[name], whole[name].detach(), atol=1e-6, rtol=1e-4)
    algo.cfg.micro_batch_rows = 0
    assert algo.micro_batches(mb) == [(mb, 1.0)]
    task.close()


@text_extra
def test_group_minibatches_hold_whole_groups_and_spread_the_ones_with_signal(
    resolve: Callable[[list[str]], Any],
) -> None:
    """``algo.minibatch_split=groups``: every row in exactly one minibatch, each minibatch made of
    whole groups, the groups with signal dealt evenly (counts differ by at most one)."""

    cfg, task, algo, data = _prepared_grpo(resolve, "algo.minibatch_split=groups")
    g, b = int(cfg.algo.group_size), data["advantages"].shape[0]
    n_groups = b // g
    adv = torch.zeros_like(data["advantages"])
    live_groups = {0, 1, 3}
    for j in live_groups:
        adv[j * g : (j + 1) * g] = torch.linspace(-1.0, 1.0, g)[:, None]
    data["advantages"] = adv
    k = 2
    chunks = algo.minibatch_indices(data, k)
    assert len(chunks) == k
    assert sorted(torch.cat(chunks).tolist()) == list(range(b))
    counts = []
    for idx in chunks:
        groups = set(data["group"][idx].tolist())
        assert len(idx) == g * len(groups)  # whole groups only
        counts.append(len(groups & live_groups))
    assert sorted(counts) == [1, 2]
    # more minibatches than groups: random rows as before
    fallback = algo.minibatch_indices(data, n_groups + 1)
    assert sorted(torch.cat(fallback).tolist()) == list(range(b))
    algo.cfg.minibatch_split = "rows"
    assert any(len(set(data["group"][idx].tolist())) > 1 for idx in algo.minibatch_indices(data, n_groups))
    task.close()


@text_extra
@pytest.mark.parametrize("rule", ["every", "entropy"])
def test_state_groups_branch_train_and_count_branch_tokens(
    train: Callable[..., dict], tmp_path: Path, rule: str
) -> None:
    """algo.group_mode=state on arithmetic: every completion branches, the continuations are
    sampled and counted (env steps, sampled tokens), and the run trains to its end."""
    s = train(
        tmp_path / rule,
        "env=arithmetic",
        "algo.group_mode=state",
        f"text.branch_rule={rule}",
        "text.branch_size=2",
        "total_steps=96",
        "eval.every_steps=1000",
        "log.every=1",
        *FAST,
    )
    metrics = [json.loads(x) for x in (tmp_path / rule / "metrics.jsonl").read_text().splitlines()]
    rows = [m for m in metrics if "rollout/sampled_completions" in m]
    assert rows and s["updates"] == len(rows) >= 2
    done, tokens = 0, 0.0
    for m in rows:
        # 4 prompts x 4 completions, plus 2 continuations per branch point
        assert m["rollout/branch_points"] > 0
        assert m["rollout/branch_completions"] == 2 * m["rollout/branch_points"]
        assert m["rollout/sampled_completions"] == 16 + m["rollout/branch_completions"]
        assert m["rollout/sampled_tokens"] == m["rollout/completion_tokens"] + m["rollout/branch_tokens"]
        assert m["rollout/branch_tokens"] >= m["rollout/branch_completions"]  # at least one token each
        done += int(m["rollout/sampled_completions"])
        tokens += m["rollout/sampled_tokens"]
        assert m["step"] == done  # the curves' step counter counts the branches
        assert m["rollout/sampled_tokens_total"] == tokens  # and the token axis counts theirs
    assert s["env_steps"] == done >= 96
    assert s["throughput/completions_per_s"] is not None and all("train/loss" in m for m in rows)


@text_extra
def test_branch_train_makes_continuations_trained_members_of_their_prompt_group(
    resolve: Callable[[list[str]], Any], train: Callable[..., dict], tmp_path: Path
) -> None:
    """text.branch_train=true: each group holds its G completions, then a slot per continuation;
    a continuation's row is its prompt + prefix + own tokens, only its own tokens are trained, its
    old log-probs are the policy's, and its segment advantage is its return minus its prefix's
    value, so one prefix's continuations are credited against each other (they sum to 0)."""
    from grpo_marl.advantages import branched_advantages
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.text import TextTask

    state = ["algo.group_mode=state", "text.branch_rule=every", "text.branch_points=1", "text.branch_size=2"]
    cfg = resolve(["env=arithmetic", *FAST, *state, "text.branch_every=1", "text.branch_train=true"])
    task = TextTask(cfg, get_spec("arithmetic"), torch.device("cpu"))
    batch = task.collect(task.policy)
    g, k, width = 4, 2, 4 + 4 * 1 * 2
    assert batch.group_size == width and batch.num_groups == 4
    d, m = batch.data, batch.metrics
    n_cont = int(m["rollout/branch_completions"])
    assert n_cont == k * int(m["rollout/branch_points"]) > 0
    assert m["rollout/trained_rows"] == 16 + n_cont
    pw = task.prompt_width
    grouped = {key: batch.grouped(key) for key in ("input_ids", "mask", "completion_mask", "rewards", "branch_mask")}
    adv = branched_advantages(
        grouped["rewards"], grouped["mask"], grouped["branch_mask"], batch.grouped("branch_value"),
        scale="none", credit="replace",
    )  # fmt: skip
    seen = 0
    for gi in range(4):
        origs = grouped["input_ids"][gi, :g]
        for j in range(g, width):
            own = grouped["mask"][gi, j]
            if not bool(own.any()):  # an unfilled slot: nothing to train
                assert (
                    not bool(grouped["branch_mask"][gi, j].any()) and float(grouped["rewards"][gi, j].abs().sum()) == 0
                )
                continue
            seen += 1
            start = int(grouped["branch_mask"][gi, j].nonzero()[0])
            assert start == 1 and own.nonzero().flatten().tolist() == list(
                range(1, int(grouped["completion_mask"][gi, j].sum()))
            )
            row = grouped["input_ids"][gi, j]
            src = [i for i in range(g) if torch.equal(origs[i, : pw + start], row[: pw + start])]
            assert src, "a continuation starts with its prompt and a prefix of one of its group's completions"
            r = float(grouped["rewards"][gi, j].sum())
            value = float(batch.grouped("branch_value")[gi, j, start])
            torch.testing.assert_close(adv[gi, j][own], torch.full((int(own.sum()),), r - value))
        # the continuations of one prefix (consecutive slots) sum to 0: credited against each other
        for a in range(g, width, k):
            if bool(grouped["mask"][gi, a].any()):
                first = adv[gi, a][grouped["mask"][gi, a]][0] + adv[gi, a + 1][grouped["mask"][gi, a + 1]][0]
                assert abs(float(first)) < 1e-6
    assert seen == n_cont
    # the old log-probs of the continuation tokens are the policy's own (ratio 1 before the update)
    logp, _ = task.log_prob(task.policy, d, need_entropy=False)
    torch.testing.assert_close(logp[d["mask"]], d["logp"][d["mask"]], atol=1e-4, rtol=1e-4)
    task.close()
    s = train(
        tmp_path / "run", "env=arithmetic", *FAST, *state, "text.branch_train=true", "total_steps=96", "log.every=1"
    )
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "rollout/trained_rows" in r]
    assert trained and all(r["rollout/trained_rows"] == 16 + r["rollout/branch_completions"] for r in trained)
    assert s["updates"] == len(trained) and all(math.isfinite(r["train/loss"]) for r in trained)


@text_extra
def test_state_group_config_refusals(run_cli: Callable[..., Any]) -> None:
    common = ("env=arithmetic", "algo.group_mode=state", "total_steps=16", *FAST)
    for bad, key in (
        ("text.branch_size=0", "text.branch_size=0 must be > 0"),
        ("text.branch_points=-1", "text.branch_points=-1 must be > 0"),
        ("text.branch_rule=sometimes", "text.branch_rule=sometimes is not valid; choose one of every, entropy"),
        ("algo.branch_credit=both", "algo.branch_credit=both is not valid; choose one of sum, replace"),
        ("text.branch_every=0", "text.branch_every=0 must be > 0"),
    ):
        proc = run_cli(*common, bad, check=False)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert key in proc.stderr, (bad, proc.stderr)
    proc = run_cli(*common, "text.max_new_tokens=3", "text.branch_every=3", check=False)
    assert proc.returncode == 2
    assert "text.branch_every=3 leaves no branch point inside a completion of at most text.max_new_tokens=3" in (
        proc.stderr
    )
