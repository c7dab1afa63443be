"""Settings for the whole suite.

Hypothesis: no deadline. Its default fails an example that takes over 200 ms, a wall-clock
threshold that a loaded machine or a second pytest worker crosses (tests/planner/test_survival.py
failed so under load, then passed alone); the suite's rule is no wall-clock thresholds in tests.
"""

from hypothesis import settings

settings.register_profile("planaria", deadline=None)
settings.load_profile("planaria")
