"""Layer 1, the scores: the papers' QA accuracy and eval table (:mod:`memkit.metrics.qa`), their
token efficiency (:mod:`memkit.metrics.efficiency`) and LoCoMo's per-category F1 that Mem-T reports
(:mod:`memkit.metrics.locomo`)."""
