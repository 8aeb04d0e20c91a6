"""Layer 6, the course: notebook helpers (:mod:`memkit.course.nb`), ``memkit reproduce``
(:mod:`memkit.course.reproduce`) and the claims page it writes (:mod:`memkit.course.results`)."""
