"""Layer 0, the core every other layer stands on: atomic files (:mod:`memkit.core.io`), the
machine's cores and threads (:mod:`memkit.core.cpu`), lanes of pinned worker processes
(:mod:`memkit.core.lanes`), the data model of a rollout (:mod:`memkit.core.trajectory`) and the flat names
of nested config knobs (:mod:`memkit.core.fields`)."""
