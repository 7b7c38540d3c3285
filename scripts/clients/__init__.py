"""One client per outside service, standard library only, so that every place the project's
code runs can import it as it is:

    transport.py     what each token-carrying client shares: HTTPS only (plain HTTP to
                     127.0.0.1 alone, the tests' fakes), no redirect followed, bounded answers,
                     Retry-After, the retry rules of an API call; and a host's GET of a
                     private page (private_get: /metrics, the metadata service) on that opener
    github.py        GitHub's REST API: its headers, one GET, an Api with the retry rules
    digitalocean.py  DigitalOcean's API: one GET, an Api with the retry rules, its pages
    prometheus.py    Prometheus' text format (vLLM's /metrics): prometheus_client's parser
                     where installed, a standard-library port of it elsewhere, one rule

Where each runs, and what it uses:
- the user's machine (the project's virtualenv): components/validate.py asks DigitalOcean and
  GitHub through digitalocean.get and github.get. Not DigitalOcean's pydo: docs/facts.md
  ("pydo") says why; one stdlib client serves the user's machine and CI alike.
- a CI runner's system python3, nothing installed (lease.yml checks out only the files it
  needs, these among them): scripts/ci/lease.py (digitalocean.api and pages, github.api),
  scripts/ci/tested.py (github.get), scripts/ci/realrun/cleanup.py (digitalocean.api, pages).
- a host (Ubuntu's python3, no virtualenv): autodown (scripts/phases/autodown/) and the front's
  waker (scripts/phases/wake/) are each shipped as one folder holding the package and this one
  side by side (autodown/ or wake/, and clients/: components/host/autodown.py and wake.py
  tree_extra). autodown reads its /metrics (transport.private_get, prometheus.totals) and
  deletes (digitalocean.delete) through them; the waker dispatches and follows the deploy run
  (github.post, github.get, github.job_log) and calls a webhook (transport.request).
"""
