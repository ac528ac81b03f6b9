"""The offline checks of deploy/kubernetes, run by ``check.py`` (and so by
.ci/kubernetes-checks and tests/deploy): rendering, schemas, policy, rules, commands and
the manifests' own consistency. Each check takes rendered YAML streams and returns a
``Result``: problems (one line each) and the figures it printed."""
