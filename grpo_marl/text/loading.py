"""Load a causal LM + tokenizer from ``model.path``: an HF model directory, a ``.gguf`` file, or a
hub name (where a network is available).

A ``.gguf`` file is dequantized by transformers (which needs the ``gguf`` package) into
``model.dtype``; the loaded model still carries transformers' GGUF quantizer marker, which makes
``save_pretrained`` refuse to write it and trainers refuse to fine-tune it, although every weight
is a plain tensor by then. :func:`load_model` drops that marker, so the result is an ordinary
trainable model and a run's saved ``model/`` is a plain HF directory (safetensors + tokenizer +
chat template) that reloads with ``model.path=``.

Every failure is one line naming the path (:class:`grpo_marl.errors.ModelPathError`); a missing
package of the ``text`` extra (transformers, tokenizers, and for ``.gguf`` files gguf and
accelerate) is a :class:`grpo_marl.errors.MissingExtraError` naming the extra.

Loading runs inside :func:`quiet_third_party`: transformers' and huggingface_hub's progress bars
("Converting and de-quantizing GGUF tensors...", "Loading weights") and warnings stay off the
terminal, where they would interleave with the run's own progress bar. ``GRPO_MARL_HF_OUTPUT=1``
shows them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from grpo_marl.errors import MissingExtraError, ModelPathError

TEXT_EXTRA = 'pip install -e ".[text]"'
#: ``name`` or ``org/name``: what a hub id looks like (local paths are tried first).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
#: Environment variable: ``1`` shows transformers'/huggingface_hub's progress bars and warnings
#: while a model loads (hidden by default, see :func:`quiet_third_party`).
SHOW_HF_OUTPUT_ENV = "GRPO_MARL_HF_OUTPUT"


def require_transformers(what: str = "text envs") -> None:
    """Raise :class:`MissingExtraError` naming the ``text`` extra when transformers is missing."""
    for mod in ("transformers", "tokenizers"):
        try:
            missing = importlib.util.find_spec(mod) is None
        except ValueError:  # a module set to None in sys.modules (blocked)
            missing = True
        if missing:
            raise MissingExtraError(f"{what} need the optional 'text' extra ({mod} is not installed): {TEXT_EXTRA}")


def require_gguf_support(path: str) -> None:
    """Raise :class:`MissingExtraError` naming the ``text`` extra when a ``.gguf`` file cannot be
    read: transformers needs the ``gguf`` package to parse it and ``accelerate`` to build the model
    (at the versions transformers asks for). Without this, transformers fails half-way through the
    load with ``accelerate is required when loading a GGUF file``, naming no extra."""
    require_transformers(f"model.path={path}")
    from transformers.utils import import_utils as iu

    for mod, available, floor in (
        ("gguf", iu.is_gguf_available, getattr(iu, "GGUF_MIN_VERSION", None)),
        ("accelerate", iu.is_accelerate_available, getattr(iu, "ACCELERATE_MIN_VERSION", None)),
    ):
        if available():
            continue
        try:
            installed = importlib.util.find_spec(mod) is not None
        except ValueError:  # a module set to None in sys.modules (blocked)
            installed = False
        why = f"{mod} is older than transformers needs ({mod}>={floor})" if installed else f"{mod} is not installed"
        raise MissingExtraError(
            f"model.path={path}: reading a .gguf file needs the optional 'text' extra ({why}): {TEXT_EXTRA}"
        )


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def quiet_third_party(show: bool | None = None) -> Iterator[None]:
    """Keep transformers' and huggingface_hub's progress bars, log warnings and Python warnings off
    the terminal for the duration of the block (a model load), then restore their settings.

    Three switches, because the libraries use three channels: transformers' log verbosity (set to
    errors), the progress-bar switches of transformers and huggingface_hub (the "Loading weights"
    bar, downloads), and ``sys.stderr`` itself, redirected to a discarded buffer, for bars that
    ignore those switches (transformers' GGUF reader draws "Converting and de-quantizing GGUF
    tensors..." with plain ``tqdm``) and for ``warnings``. Errors still surface: they are raised as
    exceptions, which :func:`load_model` turns into one line. ``show`` (default: the
    ``GRPO_MARL_HF_OUTPUT`` environment variable) leaves everything as the libraries set it.
    """
    if show is None:
        show = _truthy(os.environ.get(SHOW_HF_OUTPUT_ENV))
    if show:
        yield
        return
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars = not hub.are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # transformers' bars and huggingface_hub's
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()  # also re-enables huggingface_hub's
        if hub_bars:
            hub.enable_progress_bars()
        elif bars:
            hub.disable_progress_bars()


def looks_like_hub_id(path: str) -> bool:
    """True for ``name`` / ``org/name`` strings that are not local paths (no ``./``, ``/``, ``~``)."""
    return not path.endswith(".gguf") and bool(_HUB_ID.match(path)) and not Path(path).exists()


def check_model_path(path: str) -> str | None:
    """A one-line problem with ``model.path`` that can be seen without loading it, or None."""
    p = Path(path).expanduser()
    if p.exists():
        if p.is_dir() and not (p / "config.json").exists() and not list(p.glob("*.gguf")):
            return (
                f"model.path={path}: the directory has no config.json and no .gguf file; give a Hugging Face "
                "model directory (e.g. a run's model/ dir), a .gguf file or a hub name"
            )
        if p.is_file() and p.suffix != ".gguf":
            return f"model.path={path}: a file must be a .gguf model; otherwise give a Hugging Face model directory"
        return None
    if looks_like_hub_id(path):
        return None  # resolved on the hub at load time (needs a network)
    return f"model.path={path}: no such file or directory (give an HF model directory, a .gguf file or a hub name)"


def resolve_model_path(path: str) -> str:
    """Absolute path for local paths (so ``resume``/``evaluate`` work from any directory); hub ids
    are returned unchanged."""
    p = Path(path).expanduser()
    if p.exists() or not looks_like_hub_id(path):
        return str(p.resolve())
    return path


def is_gguf_path(path: str) -> bool:
    """True when ``model.path`` names a ``.gguf`` file or a directory holding ``.gguf`` files (and no
    config.json): a model transformers reads with its GGUF loader."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.suffix == ".gguf"
    return p.is_dir() and not (p / "config.json").exists() and any(p.glob("*.gguf"))


def _gguf_file(path: Path) -> Path | None:
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        files = sorted(path.glob("*.gguf"))
        if len(files) == 1:
            return files[0]
        if len(files) > 1:
            names = ", ".join(f.name for f in files)
            raise ModelPathError(f"model.path={path}: several .gguf files ({names}); pass one of them as model.path")
    return None


def make_plain(model: Any) -> Any:
    """Drop transformers' GGUF quantizer marker from a dequantized model (weights are plain
    tensors already), so it saves with ``save_pretrained`` and trains like any other model."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if "is_quantized" in vars(model):
        model.is_quantized = False
    for attr in ("quantization_method", "_pre_quantization_dtype"):
        if attr in vars(model):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def load_model(
    path: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from an HF directory, a ``.gguf`` file (or a directory holding one)
    or a hub name; raises :class:`ModelPathError` with one line when that fails, and
    :class:`MissingExtraError` naming the ``text`` extra when a package it needs is missing.
    Third-party progress bars and warnings are hidden while it loads (:func:`quiet_third_party`)."""
    require_transformers("model.path")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    problem = check_model_path(path)
    if problem:
        raise ModelPathError(problem)
    local = Path(path).expanduser()
    gguf = _gguf_file(local) if local.exists() else None
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf is not None:
        require_gguf_support(path)
        src, kw["gguf_file"] = str(gguf.parent), gguf.name
    else:
        src = str(local) if local.exists() else path
    try:
        with quiet_third_party():
            tok = AutoTokenizer.from_pretrained(src, **kw)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
    except ImportError as exc:  # a package transformers needs for this model (not ours to name)
        raise MissingExtraError(
            f"model.path={path}: transformers needs a package that is not installed to load it: {_first_line(exc)} "
            f"(grpo_marl's own come with the 'text' extra: {TEXT_EXTRA})"
        ) from exc
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        reason = _first_line(exc)
        where = "from the Hugging Face hub (no network?)" if not local.exists() else "as a causal LM"
        raise ModelPathError(f"model.path={path}: could not be loaded {where}: {reason[:300]}") from exc
    if gguf is not None:
        model = make_plain(model)
        model = model.to(dtype)
    # transformers declares PreTrainedModel.to as @wraps(nn.Module.to), whose typeshed signature
    # (functools._Wrapped) takes the module as the first argument: the stub is wrong, the call is not.
    return model.to(device), tok  # type: ignore[arg-type]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
