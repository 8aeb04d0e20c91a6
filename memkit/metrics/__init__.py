"""Layer 1, the scores: the papers' QA accuracy and token efficiency (:mod:`memkit.metrics.qa`)
and LoCoMo's per-category F1 that Mem-T reports (:mod:`memkit.metrics.locomo`)."""
