"""Supervised training (layer 4): the configs of behaviour cloning and pretraining
(:mod:`memkit.train.config`), importable without torch."""
