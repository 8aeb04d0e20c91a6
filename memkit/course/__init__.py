"""Layer 6, the course: notebook helpers (:mod:`memkit.course.nb`), one notebook run with papermill
(:mod:`memkit.course.execute`), ``memkit reproduce`` (:mod:`memkit.course.reproduce`) and the claims page it
writes (:mod:`memkit.course.results`)."""
