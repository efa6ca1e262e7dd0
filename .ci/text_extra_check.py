"""CI: the ``text`` extra alone trains a .gguf model end to end (no pytest, no test extras).

Run by CI in a fresh virtualenv that has only ``pip install torch==2.13.0 && pip install -e
".[text]"``: a dependency the text path needs but the extra does not install (such as accelerate,
which transformers needs to load a GGUF file) fails here, where the test suite, installed with
the ``test`` extra, would not notice it.

It writes a tiny Llama chat model to a ``.gguf`` file with the tests' own writer
(``tests/gguf_helpers.py``), a small chat JSONL, and runs one GRPO update with ``python -m
grpo_marl.train env=text_jsonl model.path=<the file>`` as a subprocess; it passes when that exits
0 and writes ``summary.json``. Usage: ``python .ci/text_extra_check.py`` (exit 0 = pass).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_GROUPS, GROUP_SIZE = 2, 4  # one update = 8 completions


def load_gguf_helpers() -> object:
    """``tests/gguf_helpers.py`` by file path (``tests`` is not a package; an installed package
    named ``tests`` would shadow it on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location("gguf_helpers", ROOT / "tests" / "gguf_helpers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    helpers = load_gguf_helpers()
    with tempfile.TemporaryDirectory(prefix="text_extra_check_") as tmp:
        tmp_path = Path(tmp)
        model = helpers.write_tiny_gguf(tmp_path / "tiny-chat.gguf", max_positions=256)  # type: ignore[attr-defined]
        data = tmp_path / "data.jsonl"
        rows = [
            {"prompt": [{"role": "user", "content": f"Compute {a} + {a + 1}."}], "answer": str(2 * a + 1)}
            for a in range(8)
        ]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        run_dir = tmp_path / "run"
        cmd = [
            sys.executable,
            "-m",
            "grpo_marl.train",
            "env=text_jsonl",
            f"+env_kwargs.path={data}",
            "+env_kwargs.accuracy=last_int_match",
            f"model.path={model}",
            f"total_steps={NUM_GROUPS * GROUP_SIZE}",
            f"algo.num_groups={NUM_GROUPS}",
            f"algo.group_size={GROUP_SIZE}",
            "log.tensorboard=false",
            "log.progress=false",
            "threads=1",
            f"hydra.run.dir={run_dir}",
        ]
        print("$", " ".join(cmd), flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        summary = run_dir / "summary.json"
        if proc.returncode != 0 or not summary.is_file():
            print(proc.stdout, end="")
            print(proc.stderr, end="", file=sys.stderr)
            why = f"exit {proc.returncode}" if proc.returncode else "no summary.json"
            print(f"FAIL: text extra check: the run ended with {why}", file=sys.stderr)
            return 1
        s = json.loads(summary.read_text())
        print(
            f"PASS: text extra check: status={s.get('status')} env_steps={s.get('env_steps')} "
            f"text/max_new_tokens={s.get('text/max_new_tokens')} eval/accuracy={s.get('eval/accuracy')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
