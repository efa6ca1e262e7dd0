"""Turn a suite's run directories into ``table.md``, ``results.json`` and learning-curve PNGs.

Reads only the files every runner writes (``metrics.jsonl``, ``summary.json``), so a run that was
cut by the budget still contributes its curve and, if it got there, its steps to threshold.

The curves, the threshold and the final-eval column use each env entry's ``metric``
(``eval/return_mean`` for control, ``eval/accuracy`` for text). Runs whose ``summary.json`` carries
``throughput/*`` keys (text: our trainer and the TRL runner) add a throughput table: median step
time, completions/s, tokens/s and peak memory over seeds.

Aggregation over seeds: medians with min-max; "steps to threshold" is the env-step count at the
first periodic greedy evaluation (20 episodes) whose mean reached the threshold. A seed that never
reached it counts as +inf, so a median over mostly-failed seeds reads "not reached" rather than
flattering the algorithm with its lucky seeds.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.suites import Suite


def metric_key(metric: str) -> str:
    """Short name of an eval metric in curves and rows: ``return`` for ``eval/return_mean``, else
    the metric's last path part (``eval/accuracy`` -> ``accuracy``)."""
    return "return" if metric == "eval/return_mean" else metric.rsplit("/", 1)[-1]


def _std_metric(metric: str) -> str | None:
    """The spread logged next to a ``*_mean`` metric (``eval/return_std``); None otherwise."""
    return metric[: -len("_mean")] + "_std" if metric.endswith("_mean") else None


THROUGHPUT = "throughput/"  # summary.json keys of grpo_marl.tasks.text.throughput_summary


def read_run(run_dir: Path, metric: str = "eval/return_mean") -> dict[str, Any]:
    """Curve (eval lines of ``metric``) + summary of one run; missing summary = unfinished (budget/crash)."""
    key, std = metric_key(metric), _std_metric(metric)
    curve: list[dict[str, float]] = []
    metrics = run_dir / "metrics.jsonl"
    tokens: float | None = None  # text runs: tokens sampled so far (``rollout/sampled_tokens_total``)
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break  # torn last line of a killed run
            if "rollout/sampled_tokens_total" in rec:
                tokens = float(rec["rollout/sampled_tokens_total"])
            if metric in rec and "time/wall_s" in rec:
                point = {"step": rec["step"], "wall_s": rec["time/wall_s"], key: rec[metric]}
                if tokens is not None or rec["step"] == 0:
                    point["tokens"] = tokens or 0.0
                if "time/train_s" in rec:  # wall seconds with the periodic evaluations taken out
                    point["train_s"] = rec["time/train_s"]
                if std is not None:
                    point[f"{key}_std"] = rec.get(std, 0.0)
                curve.append(point)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return {"curve": curve, "summary": summary}


def _crossing(curve: list[dict[str, float]], threshold: float | None, key: str) -> tuple[Any, Any, Any]:
    """``(step, wall_s, train_s)`` of the first curve point at or above ``threshold`` (Nones if none)."""
    if threshold is not None:
        for p in curve:
            if p[key] >= threshold:
                return p["step"], p["wall_s"], p.get("train_s")
    return None, None, None


def _per_seed(
    run: dict[str, Any], threshold: float | None, metric: str = "eval/return_mean", from_curve: bool = False
) -> dict[str, Any]:
    """One seed's figures; ``from_curve``: steps/time to ``threshold`` read from the curve even for
    a finished run (a threshold the runner did not know: ``Suite.threshold_from``)."""
    s, curve = run["summary"], run["curve"]
    key, std = metric_key(metric), _std_metric(metric)
    # Training seconds to threshold (evaluations excluded), where the runner measured them.
    has_train = (s is not None and "train_time_to_threshold_s" in s) or bool(curve and "train_s" in curve[0])
    train_thr = None
    if s is not None and s.get("status") != "failed":
        steps_thr, time_thr = s.get("steps_to_threshold"), s.get("time_to_threshold_s")
        train_thr = s.get("train_time_to_threshold_s")
        final_mean, final_std = s.get(metric), (s.get(std) if std else None)
        env_steps, wall = s.get("env_steps"), s.get("wall_seconds")
        finished = True
    else:  # unfinished: use what the curve shows
        steps_thr, time_thr, train_thr = _crossing(curve, threshold, key)
        last = curve[-1] if curve else None
        final_mean = last[key] if last else None
        final_std = last.get(f"{key}_std") if last else None
        env_steps = last["step"] if last else None
        wall = last["wall_s"] if last else None
        finished = False
    if from_curve:
        steps_thr, time_thr, curve_train = _crossing(curve, threshold, key)
        train_thr = curve_train if has_train else None
    sps = env_steps / wall if env_steps and wall else None
    out = {
        "steps_to_threshold": steps_thr,
        "time_to_threshold_s": time_thr,
        "final_mean": final_mean,
        "final_std": final_std,
        "env_steps": env_steps,
        "wall_seconds": wall,
        "sps": sps,
        "finished": finished,
    }
    if has_train:
        out["train_time_to_threshold_s"] = train_thr
    if s and s.get("peak_rss_mb") is not None:  # runs whose trainer reports it (summary.json)
        out["peak_rss_mb"] = float(s["peak_rss_mb"])
    throughput = {k[len(THROUGHPUT) :]: v for k, v in (s or {}).items() if k.startswith(THROUGHPUT)}
    if throughput:  # only runs that measure it (text), so other suites' results stay as they were
        out["throughput"] = throughput
    return out


def _median_range(values: list[float | None]) -> dict[str, Any]:
    """Median/min/max with None as +inf (not reached); all-None gives None."""
    xs = [math.inf if v is None else float(v) for v in values]
    if not xs:
        return {"median": None, "min": None, "max": None, "reached": 0, "n": 0}
    med = float(np.median(xs))
    finite = [x for x in xs if math.isfinite(x)]
    return {
        "median": med if math.isfinite(med) else None,
        "min": min(finite) if finite else None,
        "max": max(xs) if math.isfinite(max(xs)) else None,
        "reached": len(finite),
        "n": len(xs),
    }


def reference_threshold(
    suite: Suite, env: str, runs: dict[tuple[str, str, int], dict[str, Any]], metric: str = "eval/return_mean"
) -> float | None:
    """The median over seeds of ``suite.threshold_from``'s final ``metric`` on ``env`` (each
    seed's ``summary.json`` final, or its curve's last point when it was cut); None without runs."""
    ref = suite.threshold_from
    finals = [
        p["final_mean"]
        for (e, a, _), run in sorted(runs.items())
        if e == env and a == ref
        if (p := _per_seed(run, None, metric))["final_mean"] is not None
    ]
    return float(np.median(finals)) if finals else None


def aggregate(suite: Suite, runs: dict[tuple[str, str, int], dict[str, Any]]) -> dict[str, Any]:
    """Rows per (env, algo) and ratio blocks per env."""
    rows: dict[str, dict[str, Any]] = {}
    from_curve = suite.threshold_from is not None
    for entry in suite.envs:
        if from_curve:
            threshold = reference_threshold(suite, entry.env, runs, entry.metric)
        elif entry.threshold is not None:
            threshold = entry.threshold
        else:
            from grpo_marl.registry import get_spec

            threshold = get_spec(entry.env).threshold
        key = metric_key(entry.metric)
        for algo in suite.algos:
            seeds = sorted(s for (e, a, s) in runs if e == entry.env and a == algo)
            if not seeds:
                continue
            per = {s: _per_seed(runs[(entry.env, algo, s)], threshold, entry.metric, from_curve) for s in seeds}
            finals = [p["final_mean"] for p in per.values() if p["final_mean"] is not None]
            sps = [p["sps"] for p in per.values() if p["sps"] is not None]
            row = rows[f"{entry.env}/{algo}"] = {
                "env": entry.env,
                "label": entry.label,
                "algo": algo,
                "threshold": threshold,
                "seeds": seeds,
                "per_seed": per,
                "steps_to_threshold": _median_range([p["steps_to_threshold"] for p in per.values()]),
                "time_to_threshold_s": _median_range([p["time_to_threshold_s"] for p in per.values()]),
                f"final_{key}_mean": float(np.mean(finals)) if finals else None,
                f"final_{key}_std_over_seeds": float(np.std(finals)) if finals else None,
                f"final_{key}_min": float(np.min(finals)) if finals else None,
                f"final_{key}_max": float(np.max(finals)) if finals else None,
                "sps_median": float(np.median(sps)) if sps else None,
                "finished": sum(p["finished"] for p in per.values()),
            }
            if from_curve:  # medians over seeds, as the threshold itself
                row["threshold_from"] = suite.threshold_from
                row[f"final_{key}_median"] = float(np.median(finals)) if finals else None
                steps = [p["env_steps"] for p in per.values() if p["env_steps"] is not None]
                row["env_steps_median"] = float(np.median(steps)) if steps else None
            rss = [p["peak_rss_mb"] for p in per.values() if "peak_rss_mb" in p]
            if rss:
                row["peak_rss_mb_max"] = float(max(rss))
            if all("train_time_to_threshold_s" in p for p in per.values()):
                row["train_time_to_threshold_s"] = _median_range([p["train_time_to_threshold_s"] for p in per.values()])
            throughput = _throughput_medians([p.get("throughput") for p in per.values()])
            if throughput:
                row["throughput"] = throughput
    ratios: dict[str, dict[str, Any]] = {}
    for entry in suite.envs:
        target = rows.get(f"{entry.env}/{suite.target}")
        if target is None:
            continue
        out = {}
        for ref in suite.references:
            r = rows.get(f"{entry.env}/{ref}")
            if r is None:
                continue
            out[ref] = {
                "steps": _ratio(target["steps_to_threshold"]["median"], r["steps_to_threshold"]["median"]),
                "wall": _ratio(target["time_to_threshold_s"]["median"], r["time_to_threshold_s"]["median"]),
            }
            if "train_time_to_threshold_s" in target and "train_time_to_threshold_s" in r:
                out[ref]["train_wall"] = _ratio(
                    target["train_time_to_threshold_s"]["median"], r["train_time_to_threshold_s"]["median"]
                )
        ratios[entry.env] = out
    return {"rows": rows, "ratios": ratios}


def _throughput_medians(per_seed: list[dict[str, Any] | None]) -> dict[str, float | None]:
    """Median over the seeds that measured it, per throughput field (None where none did)."""
    names = sorted({k for t in per_seed if t for k in t})
    out: dict[str, float | None] = {}
    for name in names:
        vals = [float(t[name]) for t in per_seed if t and t.get(name) is not None]
        out[name] = float(np.median(vals)) if vals else None
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


# -- formatting ---------------------------------------------------------------------------------
def _fmt_num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _fmt_sig(x: float | None, sig: int = 2) -> str:
    """A rate or time to ``sig`` significant digits (0.41, 4.7, 0.0699), thousands-grouped integers
    from ``10**(sig-1)`` up (so rates of 10 and more print as :func:`_fmt_num` always printed them)."""
    if x is None:
        return "-"
    r = float(f"{x:.{sig}g}")
    if r == 0 or abs(r) >= 10 ** (sig - 1):
        return f"{x:,.0f}"
    return f"{r:.{sig - 1 - math.floor(math.log10(abs(r)))}f}"


def _fmt_range(mr: dict[str, Any], digits: int = 0) -> str:
    if mr["n"] == 0:
        return "-"
    reached = f"{mr['reached']}/{mr['n']}"
    if mr["median"] is None:
        best = f", best {_fmt_num(mr['min'], digits)}" if mr["min"] is not None else ""
        return f"not reached ({reached}{best})"
    hi = _fmt_num(mr["max"], digits) if mr["max"] is not None else "not reached"
    return f"{_fmt_num(mr['median'], digits)} [{_fmt_num(mr['min'], digits)}-{hi}] ({reached})"


def _ratio_sentence(
    target: str,
    ref: str,
    kind: str,
    ratio: float | None,
    label: str,
    target_reached: bool = True,
    ref_reached: bool = True,
    unit: str = "env steps",
) -> str:
    if ratio is None:
        if not target_reached and ref_reached:
            return f"**{target} did not reach the threshold on {label}** (median over seeds); {ref} did"
        if target_reached and not ref_reached:
            return f"{target} reached the threshold on {label}; {ref} did not (median over seeds)"
        return f"neither {target} nor {ref} reached the threshold on {label} (median over seeds)"
    if kind == "env steps":
        if ratio > 1.0:
            return f"**{target} needs {ratio:.2f}x the {unit} of {ref}** on {label} (more samples)"
        return f"{target} needs {ratio:.2f}x the {unit} of {ref} on {label} (fewer samples)"
    word = "slower" if ratio > 1.0 else "faster"
    if kind == "training-clock":
        return f"{target} training time to threshold (evaluations excluded) is {ratio:.2f}x {ref}'s on {label} ({word})"
    return f"{target} wall-clock to threshold is {ratio:.2f}x {ref}'s on {label} ({word})"


def _metric_word(suite: Suite) -> str:
    """What the final-eval column shows: ``eval`` for returns (as it always read), else the metric."""
    keys = sorted({metric_key(e.metric) for e in suite.envs})
    return "eval" if keys == ["return"] else "/".join(keys)


def _throughput_table(agg: dict[str, Any]) -> list[str]:
    rows = [r for r in agg["rows"].values() if r.get("throughput")]
    if not rows:
        return []
    lines = [
        "",
        "## Throughput (median over finished seeds; evaluations excluded)",
        "",
        "Step time: seconds per update (sampling, dynamic-sampling resamples included, + scoring + optimizer "
        "step). Completions/s and tokens/s: "
        "completions and completion tokens sampled per training second. Peak memory: the process's resident "
        "set (RSS) and, on CUDA, peak allocated device memory.",
        "",
        "| env | algo | step time (s) | completions/s | tokens/s | peak RSS (MB) | peak GPU (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["throughput"]
        lines.append(
            f"| {r['label']} | {r['algo']} | {_fmt_sig(t.get('step_time_s'), 3)} | "
            f"{_fmt_sig(t.get('completions_per_s'))} | {_fmt_sig(t.get('tokens_per_s'))} | {_fmt_num(t.get('peak_rss_mb'))} | {_fmt_num(t.get('peak_gpu_mb'))} |"
        )
    return lines


def table_markdown(suite: Suite, agg: dict[str, Any], meta: dict[str, Any], plots: list[str]) -> str:
    lines = [f"# Benchmark suite `{suite.name}`", "", suite.description, ""]
    lines.append(
        f"Seeds: {meta['seeds']}; jobs in parallel: {meta['jobs']} on {meta['cpus']} CPU cores; "
        f"{'SMOKE budget (not a measurement); ' if meta['smoke'] else ''}"
        f"generated {meta['generated']}."
    )
    unit, n_eval, one = suite.step_unit, suite.eval_episodes, suite.eval_unit.rstrip("s")
    ref = suite.threshold_from
    # only when every row measured it (the TRL peer of the text suites does not split its clock)
    with_train = bool(agg["rows"]) and all("train_time_to_threshold_s" in r for r in agg["rows"].values())
    with_rss = any(r.get("peak_rss_mb_max") is not None for r in agg["rows"].values())
    # Final evaluations whose size (eval.final_episodes, read from the runs) differs from the periodic.
    final_sizes = "".join(
        f"; final evaluation of {e.label}: {'/'.join(map(str, sizes))} {suite.eval_unit}"
        for e in suite.envs
        if (sizes := meta.get("final_episodes", {}).get(e.env, [n_eval])) != [n_eval]
    )
    lines += [
        "",
        "Steps/time to threshold: median [min-max] over seeds (seeds that reached it / seeds); the "
        "first periodic greedy evaluation (mean of "
        f"{n_eval} {suite.eval_unit}) at or above the threshold. Wall seconds include evaluation "
        "time and are measured while other jobs share the cores"
        + (
            "; training seconds are the same clock with the periodic evaluations taken out (both "
            "frameworks evaluate at the same env-step cadence with the same evaluation loop, so the one "
            "that needs more env steps also evaluates more often)"
            if with_train
            else ""
        )
        + (
            f". Threshold of each env: the median over seeds of {ref}'s final greedy {_metric_word(suite)}; "
            f"every run's {unit} and seconds to it are read from its curve (its final evaluation included). "
            f"Final: median over seeds of the final {n_eval}-{one} greedy mean [min, max], at the median "
            f"{unit} the runs ended at{final_sizes}. "
            if ref
            else ". Final eval: mean over seeds of the final "
            f"{n_eval}-{one} greedy mean, +- std over seeds [min-max]{final_sizes}. "
        )
        + f"Steps/s: {unit} / wall seconds of the whole run (median over seeds)."
        + (" Peak RSS: the largest over seeds of a run's peak resident memory." if with_rss else ""),
        "",
        f"| env | algo | {'threshold (' + ref + ' final)' if ref else 'threshold'} | {unit} to threshold | "
        "wall s to threshold | "
        + ("training s to threshold | " if with_train else "")
        + (f"final greedy {_metric_word(suite)} (median) | " if ref else f"final greedy {_metric_word(suite)} | ")
        + (f"{unit}/s |" if ref else "steps/s |")
        + (" peak RSS MB |" if with_rss else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if with_train else "") + ("---|" if with_rss else ""),
    ]
    digits = {e.env: e.metric_digits for e in suite.envs}
    keys = {e.env: metric_key(e.metric) for e in suite.envs}
    for r in agg["rows"].values():
        final, k, d = "-", keys[r["env"]], digits[r["env"]]
        if ref and r[f"final_{k}_median"] is not None:
            final = (
                f"{r[f'final_{k}_median']:.{d}f} [{r[f'final_{k}_min']:.{d}f}, {r[f'final_{k}_max']:.{d}f}] "
                f"at {_fmt_num(r['env_steps_median'])}"
            )
        elif not ref and r[f"final_{k}_mean"] is not None:
            final = (
                f"{r[f'final_{k}_mean']:.{d}f} +- {r[f'final_{k}_std_over_seeds']:.{d}f} "
                f"[{r[f'final_{k}_min']:.{d}f}, {r[f'final_{k}_max']:.{d}f}]"
            )
        unfinished = "" if r["finished"] == len(r["seeds"]) else f" ({len(r['seeds']) - r['finished']} cut by budget)"
        train_cell = "n/a"
        if r["threshold"] is None:
            thr, steps_cell, time_cell = "none", f"n/a (no {ref} runs)" if ref else "n/a (no threshold)", "n/a"
        else:
            thr = f"{r['threshold']:.{d}f}" if ref else r["threshold"]
            steps_cell = _fmt_range(r["steps_to_threshold"])
            time_cell = _fmt_range(r["time_to_threshold_s"], 1)
            if "train_time_to_threshold_s" in r:
                train_cell = _fmt_range(r["train_time_to_threshold_s"], 1)
        time_cell += f" | {train_cell}" if with_train else ""
        lines.append(
            f"| {r['label']} | {r['algo']}{unfinished} | {thr} | {steps_cell} | {time_cell} | {final} | "
            f"{_fmt_sig(r['sps_median'])} |" + (f" {_fmt_num(r.get('peak_rss_mb_max'))} |" if with_rss else "")
        )
    lines += _throughput_table(agg)
    lines += [
        "",
        f"## {suite.target} relative to {suite.references_label} (ratio of medians; < 1 is better for {suite.target})",
        "",
    ]
    lines += [
        f"| env | vs | {unit.replace(' ', '-')} ratio | wall-clock ratio |"
        + (" training-clock ratio (evaluations excluded) |" if with_train else ""),
        "|---|---|---|---|" + ("---|" if with_train else ""),
    ]
    sentences = []
    for entry in suite.envs:
        target_row = agg["rows"].get(f"{entry.env}/{suite.target}")
        for ref, rr in agg["ratios"].get(entry.env, {}).items():
            fmt = lambda x: "n/a" if x is None else f"{x:.2f}x"  # noqa: E731
            lines.append(
                f"| {entry.label} | {ref} | {fmt(rr['steps'])} | {fmt(rr['wall'])} |"
                + (f" {fmt(rr.get('train_wall'))} |" if with_train else "")
            )
            if target_row["threshold"] is None:
                k, d = metric_key(entry.metric), entry.metric_digits
                a, b = target_row[f"final_{k}_mean"], agg["rows"][f"{entry.env}/{ref}"][f"final_{k}_mean"]
                if a is not None and b is not None:
                    word = "higher" if a > b else "lower"
                    sentences.append(
                        f"{entry.label} has no threshold: final greedy {k} {suite.target} {a:.{d}f} "
                        f"vs {ref} {b:.{d}f} ({suite.target} {word}; mean over seeds)"
                    )
                continue
            if rr["steps"] is None:
                reached = (
                    target_row["steps_to_threshold"]["median"] is not None,
                    agg["rows"][f"{entry.env}/{ref}"]["steps_to_threshold"]["median"] is not None,
                )
                sentences.append(
                    _ratio_sentence(suite.target, ref, "env steps", None, entry.label, *reached, unit=unit)
                )
                continue
            sentences.append(_ratio_sentence(suite.target, ref, "env steps", rr["steps"], entry.label, unit=unit))
            sentences.append(_ratio_sentence(suite.target, ref, "wall-clock", rr["wall"], entry.label))
            if rr.get("train_wall") is not None:
                sentences.append(_ratio_sentence(suite.target, ref, "training-clock", rr["train_wall"], entry.label))
    if sentences:
        lines += ["", *[f"- {s}" for s in sentences]]
    if plots:
        lines += [
            "",
            f"Learning curves (greedy {metric_key(suite.envs[0].metric)} vs {unit} and vs wall seconds): "
            + ", ".join(f"`{name}`" for name in plots),
        ]
    lines.append("")
    return "\n".join(lines)


def plot_curves(
    suite: Suite, runs: dict[tuple[str, str, int], dict[str, Any]], agg: dict[str, Any], out_dir: Path
) -> list[Path]:
    """One PNG per env: greedy ``metric`` vs env steps and vs wall seconds, median + min-max band;
    and vs sampled tokens when every run of the env counts them (ours on text: branch
    continuations are shorter than completions, so equal completions are not equal cost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for entry in suite.envs:
        key = metric_key(entry.metric)
        env_curves = [r["curve"] for k, r in runs.items() if k[0] == entry.env and r["curve"]]
        xkeys = ["step", "wall_s"]
        xlabels = [suite.step_unit, "wall seconds"]
        if env_curves and all("tokens" in p for c in env_curves for p in c):
            xkeys.append("tokens")
            xlabels.append("sampled tokens")
        fig, axes = plt.subplots(1, len(xkeys), figsize=(5.5 * len(xkeys), 4))
        any_curve = False
        for algo in suite.algos:
            curves = [runs[k]["curve"] for k in runs if k[0] == entry.env and k[1] == algo and runs[k]["curve"]]
            if not curves:
                continue
            any_curve = True
            for ax, xkey in zip(axes, xkeys):
                x_max = max(c[-1][xkey] for c in curves)
                grid = np.linspace(0, x_max, 200)
                ys = []
                for c in curves:
                    xs = np.array([p[xkey] for p in c])
                    y = np.array([p[key] for p in c])
                    yi = np.interp(grid, xs, y, left=np.nan, right=y[-1])
                    ys.append(yi)
                ys = np.array(ys)
                with warnings.catch_warnings():  # all-NaN columns before a seed's first eval
                    warnings.simplefilter("ignore", RuntimeWarning)
                    med, lo, hi = np.nanmedian(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
                line = ax.plot(grid, med, label=f"{algo} (n={len(curves)})")[0]
                ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)
        thr = agg["rows"].get(f"{entry.env}/{suite.algos[0]}", {}).get("threshold")
        if suite.threshold_from:  # the same for every row of the env, whichever algorithms ran
            thr = next((r["threshold"] for r in agg["rows"].values() if r["env"] == entry.env), None)
        thr_label = f"threshold ({suite.threshold_from} final, median)" if suite.threshold_from else "threshold"
        for ax, xlabel in zip(axes, xlabels):
            if thr is not None:
                ax.axhline(thr, color="gray", ls="--", lw=1, label=thr_label)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"greedy {key} ({suite.eval_episodes} {suite.eval_unit})")
            ax.grid(alpha=0.3)
        if any_curve:
            axes[0].legend(loc="lower right", fontsize=8)
        fig.suptitle(f"{entry.label}: median and min-max over seeds")
        fig.tight_layout()
        path = out_dir / f"curves_{entry.env}.png"
        if any_curve:
            fig.savefig(path, dpi=100)
            paths.append(path)
        plt.close(fig)
    return paths


def _budget_cells(curves: list[list[dict[str, float]]], axis: str, marks: list[float], key: str, d: int) -> list[str]:
    """One cell per budget: the median [min, max] over seeds of ``key`` at the last evaluation at
    or before the budget on ``axis`` (not interpolated: what the policy had reached by then). ``-``
    where a run had no evaluation by then; ``*`` after a cell where a run had already ended (its
    final evaluation stands in for a budget it did not spend)."""
    cells = []
    for m in marks:
        seen = [[p for p in c if p[axis] <= m] for c in curves]
        vals = [max(ps, key=lambda p: p[axis])[key] for ps in seen if ps]
        if len(vals) < len(curves):  # a run without an evaluation by then (no eval.at_start)
            cells.append("-")
            continue
        ended = "*" if any(c[-1][axis] < m for c in curves) else ""
        cells.append(f"{np.median(vals):.{d}f} [{min(vals):.{d}f}, {max(vals):.{d}f}]{ended}")
    return cells


#: ``EnvEntry.compare_at`` axes (a curve point's key) and how a budget on each is written
_AXIS_LABEL: dict[str, Any] = {
    "step": lambda m, unit: f"{m:,.0f} {unit}",
    "wall_s": lambda m, unit: f"{m / 60:g} min",
}


def equal_budget_markdown(suite: Suite, runs: dict[tuple[str, str, int], dict[str, Any]]) -> list[str]:
    """Lines of the tables that read every algorithm at the same budgets, median over seeds.

    * **Sampled tokens**, for envs whose runs all count tokens (ours on text): four budgets, the
      quarters of the smallest total any run of the env sampled, and each algorithm's tokens per
      step (the runs' totals divided).
    * Each axis of the entry's ``compare_at`` (``step``: env steps, e.g. every evaluation point;
      ``wall_s``: wall seconds, evaluations included), at the budgets it lists.

    Empty when no env asks for one."""
    lines: list[str] = []
    unit = suite.step_unit.rstrip("s")
    for entry in suite.envs:
        key, d = metric_key(entry.metric), entry.metric_digits
        mine = {k: r["curve"] for k, r in runs.items() if k[0] == entry.env and r["curve"]}
        if not mine:
            continue
        tables: list[tuple[str, str, list[float], list[str]]] = []  # (axis, heading, budgets, labels)
        counted = all("tokens" in p for c in mine.values() for p in c)
        spent = {k: c for k, c in mine.items() if counted and c[-1]["tokens"] > 0}  # not only evaluated at start
        if spent:
            budget = min(c[-1]["tokens"] for c in spent.values())
            marks = [budget * f for f in (0.25, 0.5, 0.75, 1.0)]
            tables.append(("tokens", "sampled tokens", marks, [f"{m:,.0f} tokens" for m in marks]))
        for axis, marks_at in entry.compare_at.items():
            name = "wall-clock time" if axis == "wall_s" else suite.step_unit
            tables.append((axis, name, list(marks_at), [_AXIS_LABEL[axis](m, suite.step_unit) for m in marks_at]))
        for axis, heading, marks, labels in tables:
            pool = spent if axis == "tokens" else mine
            lines += ["", f"## {entry.label} at equal {heading}", ""]
            if axis == "tokens":
                lines.append(
                    f"Greedy {key} of the last evaluation at or before each budget of sampled tokens (every "
                    "token sampled for training, branch continuations included), median over seeds [min, max]; "
                    "budgets: quarters of the smallest total any run of the env sampled. Tokens per "
                    f"{unit}: the runs' totals divided (median over seeds)."
                )
            else:
                what = "wall seconds, evaluations included" if axis == "wall_s" else suite.step_unit
                lines.append(
                    f"Greedy {key} of the last evaluation at or before each budget ({what}), median over seeds "
                    "[min, max]. `*`: at least one run had ended before that budget (its final evaluation "
                    "is shown)."
                )
            extra = f" tokens / {unit} |" if axis == "tokens" else ""
            lines += [
                "",
                f"| algo |{extra} " + " | ".join(labels) + " |",
                "|---|" + ("---:|" if extra else "") + "---:|" * len(marks),
            ]
            for algo in suite.algos:
                curves = [c for k, c in sorted(pool.items()) if k[1] == algo]
                if not curves:
                    continue
                lead = f"| {algo} (n={len(curves)}) |"
                if axis == "tokens":
                    per_step = float(np.median([c[-1]["tokens"] / c[-1]["step"] for c in curves if c[-1]["step"]]))
                    lead += f" {per_step:.1f} |"
                lines.append(lead + " " + " | ".join(_budget_cells(curves, axis, marks, key, d)) + " |")
        if tables:
            lines.append("")
    return lines


def write_report(
    suite: Suite, out_dir: Path, runs: dict[tuple[str, str, int], dict[str, Any]], meta: dict[str, Any]
) -> dict[str, Any]:
    agg = aggregate(suite, runs)
    pngs = plot_curves(suite, runs, agg, out_dir)
    # What the runs' final evaluations actually used (eval.final_episodes may differ from periodic).
    finals: dict[str, set[int]] = {}
    for (env, _, _), run in runs.items():
        if run["summary"] and "eval/episodes" in run["summary"]:
            finals.setdefault(env, set()).add(int(run["summary"]["eval/episodes"]))
    meta = {**meta, "final_episodes": {env: sorted(v) for env, v in finals.items()}}
    tokens = equal_budget_markdown(suite, runs)
    (out_dir / "table.md").write_text(
        table_markdown(suite, agg, meta, [p.name for p in pngs]) + "\n".join(tokens) + ("\n" if tokens else "")
    )
    payload = {
        "suite": suite.name,
        "meta": meta,
        "rows": agg["rows"],
        "ratios": agg["ratios"],
        "runs": [{"env": e, "algo": a, "seed": s, **runs[(e, a, s)]} for (e, a, s) in sorted(runs)],
        "plots": [p.name for p in pngs],
    }
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
    return payload
