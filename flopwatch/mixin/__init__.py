"""FlopWatch as a monitoring mixin: one settings file (selectors, dtype, thresholds, windows,
severities, URLs) from which the rule files, their promtool tests, the Alertmanager files and the
dashboards are generated and tested together. `flopwatch rules build` runs it; README.md beside
this file says how to edit a template."""
