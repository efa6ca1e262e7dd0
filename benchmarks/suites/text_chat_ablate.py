"""``text_chat_ablate``: defined with the ``text`` suite in :mod:`benchmarks.suites.text` (shared runners)."""

from benchmarks.suites import text  # noqa: F401  (registers the text_chat_ablate suite)
