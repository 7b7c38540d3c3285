"""One client per outside service (issue 44): prometheus (vLLM's /metrics), github (the REST
API), digitalocean (the API). Standard library only, so that a host and a CI runner's system
python3 can run them as they are."""
