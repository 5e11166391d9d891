"""``autotune watch``: a live server's /metrics held against its stored profile (docs/watch.md).

Modules, in the order a window passes through them:

- :mod:`~autotune.watch.scrape`: one GET /metrics and what the watch reads of it (:class:`Scrape`);
- :mod:`~autotune.watch.windows`: two scrapes -> a :class:`Window` of counter differences and load;
- :mod:`~autotune.watch.profile_model`: the stored profile as the watch holds it (:class:`ProfileModel`);
- :mod:`~autotune.watch.predict`: a window against the profile, every K predicted (:func:`assess`);
- :mod:`~autotune.watch.staleness`: the hysteresis over windows -> a :class:`Verdict`;
- :mod:`~autotune.watch.output`: a verdict as one human line or one ``--json`` object;
- :mod:`~autotune.watch.endpoint`: the service's own Prometheus metrics (``--metrics-port``);
- :mod:`~autotune.watch.loop`: the scrape loop that runs them (:class:`Watch`, :func:`run`);
- :mod:`~autotune.watch.match`: which stored profile a live server is held against.

Callers import the modules (``from autotune.watch import loop, predict``) and name what they use
through them, so a test patches a name where it is looked up.
"""

__all__ = [
    "endpoint",
    "loop",
    "match",
    "output",
    "predict",
    "profile_model",
    "scrape",
    "staleness",
    "windows",
]
