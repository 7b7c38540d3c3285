"""The real run's steps, one module each (scripts/ci/real_run.py is the command line that
.github/workflows/real-run.yml calls): plan.py (the bounds from the cost cap, the throwaway
stack file), deploy.py (init, up, outputs), cleanup.py (destroy and stack rm, whatever came
before), summary.py (the job summary), runner.py (step outputs, a command run within a bound).

Imported through real_run.py, which puts scripts/ (the user tools it reuses: target.py,
bench_report.py, timeline.py) and the project (components.spec.catalog) on sys.path.
"""
