"""The text a host runs, rendered without Pulumi: the phase table (phases.py) and each phase's
settings (phase_settings.py), what is sent of a script (script_text.py), the gateway's and the
balancer's Caddyfiles, the vLLM unit, the autodown and waker settings. Reads spec/ only; creates
nothing and bills nothing."""
